"""One bug, one cause, whatever carries the value to it (conformance/explain/isolate.py), rendered through the
reference and the HF-faithful jinja2 harness with filter, test and method bugs planted
(tests/harnesses/buggy_jinja2.py).

Each bug (six filters, a test, two loop attributes, `.items()`) is reached directly and through a macro,
`.get()`, `caller()` and a `{% set %}` block (text routes only for text). Every route's reproducer is taken to
1-minimal and still keeps the route's construct (it carries the value the bug needs), so a key of all its
culprits made one cause per route, as MiniJinja's HTML-escaping `tojson` was four causes (plain, a macro,
`.get()`, `caller()`). Rendering the construct alone on the value the reference shows reaching it must key
every route by the construct, in explain's clustering and in `chatgold expectations minimize` alike; and a
filter the bug's value merely passes through is not named the culprit.
"""
from __future__ import annotations

import pytest

from conformance.explain import cluster, isolate
from conformance.explain.causes import Group, Plan, cluster_causes, isolate_culprits
from conformance.explain.driver import render_pairs
from conformance.explain.finish import finish_baseline
from conformance.explain.minimal import is_one_minimal
from conformance.explain.reduce import Found
from conformance.explain.signature import compare
from conformance.judge.expectations import Expectations, KnownCause
from conformance.judge.status import Status
from runners.base import Conversation, RenderRequest

PLANTED = ("trim-keeps-newlines", "tojson-escapes-html", "join-ignores-separator", "lower-ascii-only",
           "length-counts-bytes", "replace-first-only", "iterable-false-on-strings", "items-sorted",
           "get-default-ignored", "loop-last-early", "loop-index-from-zero")

CONTENT = "messages[0].content"
REQUIRED = "tools[0].function.parameters.required"
PROPERTIES = "tools[0].function.parameters.properties"

# (get-default-ignored changes `.get(k, d)` only: the routes' `.get(k)` is as the reference's)
# bug -> (the construct's snippet, V standing for the value; the data path; the value there, the smallest that
# shows the bug (the routes must be 1-minimal, their data too); the key's culprits)
BUGS = {
    "trim-keeps-newlines": ("{{ V|trim }}", CONTENT, "\n", ["filter:trim"]),
    "tojson-escapes-html": ("{{ V|tojson }}", CONTENT, "<", ["filter:tojson"]),
    "join-ignores-separator": ("{{ V|join(', ') }}", REQUIRED, ["", ""], ["filter:join"]),
    "lower-ascii-only": ("{{ V|lower }}", CONTENT, "É", ["filter:lower"]),
    "length-counts-bytes": ("{{ V|length }}", CONTENT, "é", ["filter:length"]),
    "replace-first-only": ("{{ V|replace('-', '+') }}", CONTENT, "--", ["filter:replace"]),
    "iterable-false-on-strings": ("{% if V is iterable %}Y{% endif %}", CONTENT, "", ["test:iterable"]),
    "loop-last-early": ("{% for i in V %}{% if loop.last %}L{% endif %}{% endfor %}", REQUIRED, ["", ""],
                        ["loop:last"]),
    "loop-index-from-zero": ("{% for i in V %}{{ loop.index }}{% endfor %}", REQUIRED, [""], ["loop:index"]),
    # a carrier that computes an order: keyed as a reproducer with no construct of its own is (by what it reads)
    "items-sorted": ("{% for k, x in V.items() %}{{ k }}{% endfor %}", PROPERTIES, {"b": {}, "a": {}}, []),
}


def routes(snippet: str, path: str) -> dict:
    """The ways a template reaches the value at `path` with the construct: directly, through a macro, `.get()`,
    and, for text, `caller()` and a `{% set %}` block (both make text of what they carry)."""
    parent, _, key = path.rpartition(".")
    out = {
        "plain": snippet.replace("V", path),
        "macro": "{% macro m(v) %}" + snippet.replace("V", "v") + "{% endmacro %}{{ m(" + path + ") }}",
        "get": snippet.replace("V", f"{parent}.get('{key}')"),
    }
    if path == CONTENT:
        out["caller"] = ("{% macro m() %}" + snippet.replace("V", "caller()") + "{% endmacro %}"
                         "{% call m() %}{{ " + path + " }}{% endcall %}")
        out["set-block"] = "{% set v %}{{ " + path + " }}{% endset %}" + snippet.replace("V", "v")
    return out


def _requests() -> dict:
    """(bug, route) -> RenderRequest."""
    out = {}
    for bug, (snippet, path, value, _) in BUGS.items():
        if path == CONTENT:
            conversation = Conversation(messages=[{"role": "", "content": value}])
        else:
            key = path.rpartition(".")[2]
            conversation = Conversation(messages=[{"role": ""}],
                                        tools=[{"function": {"parameters": {key: value}}}])
        for route, template in routes(snippet, path).items():
            out[bug, route] = RenderRequest(template, conversation, None, None, f"t-{bug}-{route}", "c")
    return out


@pytest.fixture(scope="module")
def rendered(planted):
    """(bug, route) -> Found: every route's reproducer taken to 1-minimal as the reducer's steps take it (the
    smallest candidate that keeps the difference, until none does: what `expectations minimize` does), rendered
    on both sides, each differing."""
    reference, engine = planted
    requests = {}
    for name, request in _requests().items():
        repro = {"template": request.template, "case": request.conversation.to_dict()}
        for _ in range(40):
            verdict = is_one_minimal(repro, engine, reference)
            assert verdict or verdict.kept, (name, verdict.reason)
            if verdict:
                break
            _, template, case = verdict.kept[0]
            repro = {"template": template, "case": case}
        requests[name] = RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), None, None,
                                       request.template_id, "c")
    out = {}
    for (name, request), (ref, eng) in zip(requests.items(), render_pairs(reference, engine,
                                                                          list(requests.values()))):
        symptom = compare(ref, eng)
        assert symptom is not None and symptom.differs, (name, request.template, ref, eng)
        out[name] = Found(request, ref, eng, symptom, 1, True)
    return out


def _key(found: Found, constructs: list) -> str:
    data = found.request.conversation.to_dict()
    return cluster.cause_key(found.symptom, constructs, found.reference, found.engine, False,
                             cluster.read_paths(found.request.template, data), data)


def test_every_route_keeps_a_carrier_when_one_minimal(rendered):
    """The reducer cannot take the carrier away: each route's 1-minimal reproducer keeps a culprit besides the
    bug's construct (the key of all its culprits made one cause per route)."""
    for (bug, route), found in rendered.items():
        if route != "plain":
            own = set(cluster.culprits(cluster.constructs_of(found.request.template)))
            assert own - set(BUGS[bug][3]), (bug, route, found.request.template)


def test_each_bug_through_every_route_is_one_cause_keyed_by_its_construct(planted, rendered):
    """Explain's clustering (isolate_culprits, then cluster_causes): one cause per bug, holding every route's
    cell, keyed and titled by the bug's construct."""
    reference, engine = planted
    found = {(f"t-{bug}-{route}", "c"): repro for (bug, route), repro in rendered.items()}
    plan = Plan({}, [])
    for group_key, repro in found.items():
        cell = type("Cell", (), {"key": group_key, "status": repro.symptom.status})()
        plan.groups[group_key] = Group(group_key, repro.symptom, [cell], repro.request)
    constructs = isolate_culprits(found, reference, engine)
    causes = cluster_causes(plan, found, set(), constructs)
    by_bug = {}
    for cause in causes:
        bugs = {bug for bug in BUGS if any(t.startswith(f"t-{bug}-") for t, _ in cause.cells)}
        assert len(bugs) == 1, (cause.title, cause.cells)
        by_bug.setdefault(bugs.pop(), []).append(cause)
    for bug, (snippet, path, _, culprits) in BUGS.items():
        assert len(by_bug[bug]) == 1, [(c.title, c.cells) for c in by_bug[bug]]
        [cause] = by_bug[bug]
        assert sorted(cause.cells) == sorted((f"t-{bug}-{route}", "c") for route in routes(snippet, path)), bug
        assert cause.constructs == culprits, (bug, cause.title)


def test_the_filter_a_bug_passes_through_is_not_its_culprit(planted):
    """Isolation narrows to the construct that shows the difference alone, not to the last one: with
    `dict.get(k, d)` the bug (get-default-ignored), `|trim` of what it returns is the same on both sides alone,
    and the cause is keyed by `.get()`."""
    reference, engine = planted
    request = RenderRequest("{{ messages[0].get('name', '<x>')|trim }}",
                            Conversation(messages=[{"role": "user", "content": "hi"}]), None, None, "t", "c")
    [(ref, eng)] = render_pairs(reference, engine, [request])
    symptom = compare(ref, eng)
    assert symptom is not None and symptom.status == Status.DIVERGED, (ref, eng)
    constructs = isolate.isolated_constructs(request, symptom, ref, eng, reference, engine)
    assert cluster.culprits(constructs) == ["method:get"]


def test_minimize_merges_a_bug_reached_through_a_macro_with_the_bug_reached_directly(planted, rendered):
    """`chatgold expectations minimize` keys stored reproducers by the same isolation: the trim bug stored as
    a plain cause and as a macro cause (two ids, as the baselines hold) becomes one cause with both cells."""
    reference, engine = planted
    causes, cells = {}, {}
    for route in ("plain", "macro", "caller"):
        found = rendered["trim-keeps-newlines", route]
        old = KnownCause(f"c-old-{route}", route, f"reason {route}", "", [], found.symptom.to_dict(),
                         {"template": found.request.template, "case": found.request.conversation.to_dict(),
                          "bos_token": None, "eos_token": None})
        causes[old.id] = old
        cells[f"t-{route}"] = {"c": f"diverged@{old.id}"}
    baseline = Expectations("buggy", cells, [], None, causes, {})
    new, counts, _ = finish_baseline(baseline, engine, reference)
    assert counts["causes_before"] == 3 and counts["causes_after"] == 1, counts
    [cause] = new.causes.values()
    assert cause.constructs == ["filter:trim"]
    assert {value.rpartition("@")[2] for cases in new.cells.values() for value in cases.values()} == {cause.id}
    assert all(f"reason {route}" in cause.reason for route in ("plain", "macro", "caller"))



# Corpus templates that bring a value to `tojson` plainly, through `.get()`, a macro's output and `caller()`.
ROUTED = ["ai21labs-jamba-tiny-dev", "apriel-1.6-15b-thinker-fixed", "axolotl-command_a_rag",
          "openbmb-minicpm3-4b"]


def test_explain_files_a_bug_reached_through_every_route_under_one_cause():
    """End to end on corpus templates x every case: `chatgold explain` of the harness with only the
    HTML-escaping `tojson` planted gives one cause holding every failing cell (it was four: plain, a macro,
    `.get()`, `caller()`, as in MiniJinja's baseline)."""
    import shlex
    import sys
    from pathlib import Path

    from conformance.checkrun import check_cells
    from conformance.explain import explain
    from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
    from conformance.judge.status import NON_MATCHING
    from runners import get_runner

    harness = Path(__file__).parent / "harnesses" / "buggy_jinja2.py"
    argv = [sys.executable, str(harness), "--bug", "tojson-escapes-html"]
    cells = Selection.load(ROUTED).cells()
    with get_runner("command:" + shlex.join(argv), workers=2, timeout=20) as engine, \
            get_runner("hf", workers=2) as reference:
        results = check_cells(engine, cells, GoldenJudge(), tokens=False)
        explanation = explain(results, engine, reference, requests_by_cell(cells))
    failing = {r.key for r in results.results if r.status in NON_MATCHING}
    assert {template for template, _ in failing} == set(ROUTED)
    assert explanation.unexplained == []
    assert [(c.constructs, set(c.cells)) for c in explanation.causes] == [(["filter:tojson"], failing)], \
        [(c.title, len(c.cells)) for c in explanation.causes]
