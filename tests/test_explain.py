"""chatgold explain: planted bugs are found exactly; reproducers are small and confirmed; the cache answers a
second run; the pieces (symptoms, template tree, clustering) behave."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from conformance import schema_validator
from conformance.explain import explain
from conformance.explain import template as tpl
from conformance.explain.cache import ExplainCache
from conformance.explain.signature import compare, edits
from conformance.checkrun import check_cells
from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
from conformance.judge.status import NON_MATCHING, Status
from runners import get_runner
from runners.base import Raised, RefusalKind, RenderRequest, Rendered

HARNESS = Path(__file__).parent / "harnesses" / "planted.py"
BUGS = ("tojson-sorts-keys", "trim-does-nothing", "no-string-test")
# Each bug shows in these templates, and no cell is hit by two bugs (asserted below, not assumed).
TEMPLATES = ["qwen-qwen2.5-7b-instruct", "meta-llama-llama-3.1-8b-instruct", "qwen-qwen2-vl-2b"]
CASES = ["chat-single-user", "chat-system", "chat-whitespace-padded", "chat-multi-turn", "tools-one",
         "tools-one-system", "tool-call-args-object", "content-parts-image"]
TITLE_WORDS = {"tojson-sorts-keys": "tojson", "trim-does-nothing": "trim", "no-string-test": "is string"}


def planted(*bugs):
    argv = [sys.executable, str(HARNESS)] + [arg for bug in bugs for arg in ("--bug", bug)]
    return get_runner("command:" + shlex.join(argv), workers=2, timeout=20)


@pytest.fixture(scope="module")
def selection():
    return Selection.load(TEMPLATES, CASES)


@pytest.fixture(scope="module")
def reference():
    runner = get_runner("hf", workers=2)
    yield runner
    runner.close()


def failing(runner, cells) -> set:
    results = check_cells(runner, cells, GoldenJudge())
    assert not [r for r in results.results if not r.passed and r.status not in NON_MATCHING], \
        "the planted harness must only ever differ, never error or skip"
    return {r.key for r in results.results if r.status in NON_MATCHING}


def explained(runner, reference, cells, cache=None):
    results = check_cells(runner, cells, GoldenJudge())
    return results, explain(results, runner, reference, requests_by_cell(cells), cache=cache)


def test_planted_bugs_are_found_exactly(selection, reference, tmp_path):
    cells = selection.cells()
    alone = {}
    for bug in BUGS:
        with planted(bug) as runner:
            alone[bug] = failing(runner, cells)
        assert alone[bug], f"{bug} shows in no cell of the selection: the test would prove nothing"
    for first in BUGS:
        for second in BUGS:
            if first < second:
                assert not alone[first] & alone[second], f"{first} and {second} hit the same cells"

    cache = ExplainCache(tmp_path / "cache")
    with planted(*BUGS) as runner:
        results, explanation = explained(runner, reference, cells, cache)
        assert {r.key for r in results.results if r.status in NON_MATCHING} == set().union(*alone.values())
        assert explanation.unexplained == []
        assert len(explanation.causes) == len(BUGS), [c.title for c in explanation.causes]
        schema_validator("explain.schema.json").validate(explanation.to_dict())
        found = {}
        for cause in explanation.causes:
            matches = [bug for bug in BUGS if set(cause.cells) == alone[bug]]
            assert len(matches) == 1, f"{cause.title}: its cells are not exactly one planted bug's"
            found[matches[0]] = cause
            assert cause.confirmed
            repro = cause.repro()
            assert repro["lines"] <= 3 and repro["messages"] <= 2, repro
            assert TITLE_WORDS[matches[0]] in cause.title
        assert set(found) == set(BUGS)
        # The same bug with two symptoms (the reference renders some cells and refuses others) is one cause.
        assert found["no-string-test"].statuses.keys() <= {"engine-raised", "raised-differently"}

        # A second run reads every reduction from the cache and finds the same causes.
        _, again = explained(runner, reference, cells, cache)
    assert again.stats["reduced"] == 0 and again.stats["cached"] == explanation.stats["groups"]
    assert [(c.id, sorted(c.cells)) for c in again.causes] == [(c.id, sorted(c.cells)) for c in explanation.causes]
    # The stages between reduction and confirmation rendered once and were read back (confirmation never reads them).
    first, second = explanation.stats["cache"]["outcomes"], again.stats["cache"]["outcomes"]
    assert first["rendered"] > 0 and second == {"stored": first["rendered"] + first["stored"], "rendered": 0}
    assert all(c.confirmed for c in again.causes)


def test_no_bug_no_cause(selection, reference):
    with planted() as runner:
        results, explanation = explained(runner, reference, selection.cells())
    assert results.figure()["conformance"] == 100.0
    assert explanation.causes == [] and explanation.unexplained == []


# -- the pieces ---------------------------------------------------------------------------------------------

def test_symptoms_keep_the_same_difference_only():
    target = compare(Rendered('{"a": 1, "b": "x"}'), Rendered('{"b": "x", "a": 1}'))
    assert target.status == Status.DIVERGED and target.edits
    assert compare(Rendered('{"a": 1}'), Rendered('{"a": 1}')).status == Status.MATCH
    assert not compare(Rendered("x"), Rendered("y")).keeps(target)
    assert compare(Rendered('{"a": 1, "b": "x"}'), Rendered('{"b": "x", "a": 1}')).keeps(target)
    raised = compare(Rendered("ok"), Raised("unknown filter: tojson (in chat_template:12)", RefusalKind.RENDER))
    elsewhere = compare(Rendered("other"), Raised("unknown filter: tojson (in chat_template:3)", RefusalKind.RENDER))
    assert elsewhere.keeps(raised)  # locations are not part of a refusal's symptom
    assert not compare(Rendered("x"), Raised("unknown test", RefusalKind.RENDER)).keeps(raised)
    # Content a reducer shortens does not make the same edit look new; a keyword printed differently stays itself.
    assert edits("Hello there" + "\n", "Hello there") == edits("Hi\n", "Hi") == frozenset({("\n", "")})
    assert edits("True", "true") == frozenset({("True", "true")})
    assert edits("You are Qwen. Hi", "Answer in one sentence. Hi") == edits("Be brief. Hi", "Hi there. Hi")


def test_a_title_quotes_the_refusal_as_said_while_the_symptom_reads_digits_as_zero():
    from conformance.explain import cluster
    said = Raised("UndefinedError: list object has no element -1 (in chat_template:4)", RefusalKind.RENDER)
    symptom = compare(said, Rendered("x"))
    assert symptom.refusal.endswith("has no element -0")   # one symptom with -2
    title = cluster.title(symptom, ["op:subscript"], said, Rendered("x"))
    assert title.endswith("(UndefinedError: list object has no element -1)"), title


def test_far_apart_texts_are_diffed_line_by_line_with_the_same_edits():
    """Two differences 600 lines apart leave a middle too long for one token diff (cubic on repeated single
    spaces): lines are diffed first, then tokens inside each changed line, so the edits are the same."""
    lines = [f"<|turn|> user {i} says hello there\n" for i in range(600)]
    changed = list(lines)
    changed[0], changed[-1] = lines[0].replace("hello", "hi"), lines[-1].replace("there\n", "there \n")
    reference, engine = "".join(lines), "".join(changed)
    from conformance.explain import signature

    assert len(signature._TOKENS.findall(reference)) ** 2 > signature.TOKEN_DIFF_LIMIT
    assert edits(reference, engine) == frozenset({("hello", "hi"), ("", " ")})


def test_template_tree_keeps_the_exact_source_and_candidates_parse():
    source = ("{%- if messages[0].role == 'system' -%}\n  {{- messages[0].content | trim }}\n{%- elif x %}y"
              "{%- else %}{# c #}z{% endif %}\n{% for m in messages if m.role != 'system' %}{{ m.content }}"
              "{% else %}none{% endfor %}{% raw %}{{ kept }}{% endraw %}{% generation %}g{% endgeneration %}")
    tree = tpl.build_tree(source)
    assert tpl.source_of(tree) == source
    assert [type(n).__name__ for n in tree][:1] == ["Block"]
    for path in tpl.all_paths(tree):
        node = tpl.node_at(tree, path)
        if isinstance(node, tpl.Block):
            for variant in tpl.block_variants(node):
                candidate = tpl.source_of(tpl.replace_at(tree, path, variant))
                assert tpl.parses(candidate) or "loop" in candidate, candidate
        else:
            for leaf in tpl.expression_variants(node):
                assert tpl.parses(tpl.source_of(tpl.replace_at(tree, path, (leaf,)))), leaf.text
    instrumented, arms = tpl.instrumented(tree)
    assert tpl.parses(instrumented) and len(arms) == 6  # if: 3 arms, for: 2, generation: 1


def test_baseline_fast_path_known_causes_and_stale_causes(reference, tmp_path):
    """Held against a format-2 baseline: known cells keep their cause without a reduction, a cell new to the
    baseline whose cause is known is known, and a known cause whose reproducer no longer differs is news."""
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.judge.expectations import (
        expectations_path,
        load_expectations,
        update_expectations,
    )
    from conformance.judge.status import Verdict

    selection = Selection.load(["meta-llama-llama-3.1-8b-instruct"], ["chat-whitespace-padded", "chat-single-user"])
    cells = selection.cells()
    def check_run():
        return CheckRun(cells, expectations_dir=tmp_path, explain=ExplainOptions(), reference=lambda: reference)

    with planted("trim-does-nothing") as runner:
        results = check_run().check(runner)
        first = results.explanation
        [cause] = first.causes
        update_expectations(results.name, results.results, directory=tmp_path,
                            causes={c.id: c.to_dict() for c in first.causes})
        path = expectations_path(results.name, tmp_path)
        data = json.loads(path.read_text())
        # a known cause this run cannot touch, whose reproducer the engine renders like the reference
        data["causes"].append({"id": "c-0000000000", "title": "fixed", "reason": "was a bug",
                               "symptom": {"status": "diverged", "edits": [["", " "]]},
                               "repro": {"template": "{{ messages[0].content }}",
                                         "case": {"messages": [{"role": "user", "content": "x"}]}}})
        template = cells[0].template.id
        data["cells"][template]["chat-single-user"] = "diverged:0000000000000000@c-0000000000"
        path.write_text(json.dumps(data))
        again = check_run().check(runner)
        second = again.explanation
    assert second.stats["fast_path"] == len(cause.cells) and second.stats["reduced"] == 0
    assert [c.id for c in second.causes] == [cause.id] and second.causes[0].confirmed
    assert [s["id"] for s in second.stale] == ["c-0000000000"]
    verdicts = {r.case_id: r.verdict for r in again.results}
    assert verdicts["chat-whitespace-padded"] == Verdict.EXPECTED_FAIL
    assert verdicts["chat-single-user"] == Verdict.UNEXPECTED_PASS  # it matches: the baseline is stale there too
    assert load_expectations(results.name, tmp_path).causes[cause.id].repro["template"] == cause.repro()["template"]


def test_explain_cli_writes_json_markdown_html(tmp_path, capsys):
    """`chatgold explain` on real MiniJinja: its tojson escapes an apostrophe the reference leaves alone."""
    from conformance.cli import main

    status = main(["explain", "--runner", "minijinja", "--workers", "1", "--template", "qwen-qwen2.5-7b-instruct",
                   "--case", "tools-no-parameters", "--case", "chat-single-user", "--no-cache",
                   "--json", str(tmp_path / "e.json"), "--markdown", str(tmp_path / "e.md"),
                   "--html", str(tmp_path / "e.html")])
    assert status == 0
    data = json.loads((tmp_path / "e.json").read_text())
    schema_validator("explain.schema.json").validate(data)
    [cause] = data["causes"]
    assert cause["cells"] == [["qwen-qwen2.5-7b-instruct", "tools-no-parameters"]]
    assert "tojson" in cause["title"] and cause["repro"]["confirmed"] and cause["gain"] > 0
    assert "tojson" in cause["repro"]["template"] and cause["repro"]["lines"] <= 3
    assert cause["id"] in capsys.readouterr().out
    assert cause["title"] in (tmp_path / "e.md").read_text()
    assert f'cause-minijinja-{cause["id"]}' in (tmp_path / "e.html").read_text()


def test_a_slice_the_difference_does_not_need_can_go_and_a_stepped_one_is_a_culprit():
    from conformance.explain.cluster import constructs_of, culprits

    [leaf] = tpl.build_tree("{%- set message = (messages[::-1])[0] %}")
    # the slice dropped, or the subscript (a shorter path)
    assert [v.text for v in tpl.expression_variants(leaf)] == ["{%- set message = messages[::-1] %}",
                                                               "{%- set message = messages[0] %}"]
    assert culprits(constructs_of("{{ messages[::-1] }}")) == ["op:slice-step"]
    assert culprits(constructs_of("{{ messages[1:] }}")) == []  # a plain slice only carries the messages
    # read with the reference's parser: its `{% generation %}` tag does not cost the template its constructs
    assert culprits(constructs_of("{% generation %}{{ messages[::-1] }}{% endgeneration %}")) == \
        ["op:slice-step", "stmt:generation"]


def test_macro_inlining_and_loop_unrolling_give_parseable_smaller_templates():
    source = ("{% macro show(x, sep='; ') %}[{{ x }}]{{ sep }}{% endmacro %}"
              "{%- for m in messages %}{{- show(m.content) }}{% endfor %}")
    tree = tpl.build_tree(source)
    [inlined] = list(tpl.inline_variants(tree))
    text = tpl.source_of(inlined)
    assert tpl.parses(text) and "{%- set x = m.content %}{%- set sep = '; ' %}[{{ x }}]{{ sep }}" in text
    loop = tpl.node_at(tree, (1,))
    flat = tpl.source_of(tpl.unrolled(loop))
    assert tpl.parses(flat) and flat.startswith("{%- set m = (messages)[0] %}")
    assert tpl.unrolled(tpl.build_tree("{% for m in xs %}{{ loop.index }}{% endfor %}")[0]) is None



def _probe(request, engine, reference):
    """Drive the template-ignored probe of a fresh reduction, answering each render with (reference, engine)."""
    from conformance.explain.reduce import Reduction, conversation_dict

    reduction = Reduction(request, compare(reference(request.template), engine(request.template)))
    steps = reduction.template_ignored(request.template, conversation_dict(request.conversation))
    try:
        requests = next(steps)
        while True:
            requests = steps.send([(reference(r.template), engine(r.template)) for r in requests])
    except StopIteration as done:
        return done.value


def test_an_engine_that_prints_nothing_is_not_said_to_ignore_the_template():
    request = RenderRequest.make("{% if messages[0].content %}[{{ messages[0].content }}]{% endif %}",
                                 [{"role": "user", "content": "hi"}])
    reference = lambda source: Rendered("[hi]" if "{%" in source else source)   # plain text prints as itself
    # Skipping the branch prints nothing, as an empty template does: that is not a format of its own.
    assert _probe(request, lambda s: Rendered(""), reference) is False
    # The same bytes whatever the template says (and not nothing) is one.
    own = lambda source: Rendered("<|im_start|>user\nhi<|im_end|>\n")
    assert _probe(request, own, reference) is True
    # A refusal that does not depend on the template is too.
    refuses = lambda source: Raised("tools param requires --jinja flag", RefusalKind.UNSUPPORTED)
    assert _probe(request, refuses, reference) is True
    # llama.cpp puts built-in ChatML in place of an empty template: a template that is ChatML renders the same
    # as an empty one there, yet the engine reads it (plain text prints as itself).
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    builtin_when_empty = lambda source: Rendered("<|im_start|>user\nhi<|im_end|>\n" if source in ("", chatml)
                                                 else source)
    as_chatml = RenderRequest.make(chatml, [{"role": "user", "content": "hi"}])
    strict = lambda source: Raised("no", RefusalKind.RENDER) if "{%" in source else Rendered(source)
    assert _probe(as_chatml, builtin_when_empty, strict) is False


def test_the_cache_keeps_key_order_apart():
    """Two conversations that differ only in key order are different inputs (`tojson` prints keys in order)."""
    template = "{{ messages[0].tool_calls[0].function.arguments | tojson }}"
    args = [{"a": 1, "b": 2}, {"b": 2, "a": 1}]
    keys = {ExplainCache.key("engine", "reference", RenderRequest.make(template, [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": a}}]}]),
        "diverged") for a in args}
    assert len(keys) == 2


def test_a_change_to_a_runners_code_retires_its_cached_reductions():
    """The cache names a builtin runner by its name, version and its code identity (the result store's): a
    product runner that reproduces one more step must not be answered with reductions made before it did."""
    from conformance.explain.cache import code_identity, runner_identity

    runner = get_runner("tgi")
    try:
        code = code_identity(runner)
        # tgi renders with serde_shapes.py too: it is part of what it is
        assert code and code["code"]
        info = {"name": "tgi", "version": "3.x"}
        edited = dict(code, code="0" * 64)
        assert runner_identity(info, True, code) != runner_identity(info, True, edited)
        assert runner_identity(info, True, code) != runner_identity(info, True)
    finally:
        runner.close()
    from runners.identity import PROTOCOL_FILES, source_digest

    # ...so their bytes are in its digest: without them the digest is another
    own = ("tgi_runner.py", "minijinja_runner.py", "hf.py")
    assert code["code"] == source_digest(*PROTOCOL_FILES, *sorted({*own, "serde_shapes.py"}))
    assert code["code"] != source_digest(*PROTOCOL_FILES, *sorted(own))


def test_the_verdict_is_the_same_with_and_without_the_explain_stage_for_every_cell_whose_cause_is_known(
        reference, tmp_path):
    """The verdict is decided once, after causes: a cell the baseline knows with its cause gets the same verdict
    with `--no-explain`; a cell new to the baseline is known only once explaining finds a known cause for it."""
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.judge.expectations import expectations_path, load_expectations, update_expectations
    from conformance.judge.status import Verdict

    cells = Selection.load(TEMPLATES[:1], ["tools-one", "tools-one-system", "chat-single-user"]).cells()

    def verdicts(runner, explain) -> dict:
        check = CheckRun(cells, expectations_dir=tmp_path, explain=explain, reference=lambda: reference)
        return {r.key: r.verdict for r in check.check(runner).results}

    with planted("tojson-sorts-keys") as runner:
        recorded = CheckRun(cells, expectations_dir=tmp_path, explain=ExplainOptions(bare=True),
                            reference=lambda: reference).check(runner)
        update_expectations(recorded.name, recorded.results, directory=tmp_path,
                            causes={c.id: c.to_dict() for c in recorded.explanation.causes})
        [cause] = recorded.explanation.causes
        assert len(cause.cells) == 2, cause.cells  # both tools cells: tojson sorts the tool's keys
        path = expectations_path(recorded.name, tmp_path)
        data = json.loads(path.read_text())
        new_cell = sorted(cause.cells)[0]
        del data["cells"][new_cell[0]][new_cell[1]]  # now new to the baseline; its cause is still known
        path.write_text(json.dumps(data))
        baseline = load_expectations(recorded.name, tmp_path)
        with_causes = verdicts(runner, ExplainOptions())
        without = verdicts(runner, None)
    known = [c.key for c in cells if (e := baseline.get(*c.key)) is not None and e.cause]
    assert known == [sorted(cause.cells)[1]]
    assert all(with_causes[key] == without[key] == Verdict.EXPECTED_FAIL for key in known)
    assert with_causes[new_cell] == Verdict.EXPECTED_FAIL and without[new_cell] == Verdict.UNEXPECTED_FAIL
    matching = [c.key for c in cells if c.key not in cause.cells]
    assert all(with_causes[key] == without[key] == Verdict.EXPECTED_PASS for key in matching)


def test_the_exact_text_probe_renders_the_same_under_every_whitespace_mode():
    """The probe that asks whether an engine keys templates by their text must not change how the template
    renders: an appended comment turned a final newline from stripped into printed without trim_blocks, and
    the reducer then reduced only the case (whole 54-120-line templates as reproducers)."""
    import jinja2

    sources = ["{% if true %}x{% endif %}\n", "{%- for m in messages %}\n  {{ m }}\n{%- endfor %}\n",
               "{# c #}\n{{ 'a' }}", "plain\ntext\n", "\n{% set x = 1 %}\n{{ x }}", "{% raw %}{{ x }}{% endraw %}\n"]
    for trim in (False, True):
        for lstrip in (False, True):
            env = jinja2.Environment(trim_blocks=trim, lstrip_blocks=lstrip)
            for source in sources:
                variants = tpl.neutral_variants(source)
                assert variants and source not in variants  # one where the template has no tag to edit
                for variant in variants:
                    assert env.from_string(variant).render(messages=["a"]) == env.from_string(source).render(
                        messages=["a"]), (trim, lstrip, source, variant)
    env = jinja2.Environment()   # what the old probe did
    assert env.from_string(sources[0] + "{# chatgold #}").render() != env.from_string(sources[0]).render()


def test_a_candidate_showing_a_second_difference_still_keeps_the_first():
    target = compare(Rendered("a\nb c"), Rendered("a\n\nb c"))
    both = compare(Rendered("x\ny z"), Rendered("x\n\ny  z"))     # the same first edit, then another one
    assert both.keeps(target)
    other_first = compare(Rendered("x y\nz"), Rendered("x  y\n\nz"))
    assert not other_first.keeps(target)


def test_a_stored_reproducer_that_renders_as_recorded_is_not_stale():
    """A baseline's symptoms were stored by an older comparison (e.g. a whitespace insertion `  ` that today's
    normalises to ` `): a reproducer whose both sides still render the recorded bytes must not read "no longer
    differs as recorded". MiniJinja's whole bundled baseline is checked as the gate checks it."""
    from dataclasses import replace

    from conformance.explain.baseline import check_known_causes
    from conformance.judge.expectations import load_expectations

    baseline = load_expectations("minijinja")
    causes = list(baseline.causes.values())
    diverged = next(c for c in causes if c.symptom.get("status") == "diverged")
    # its symptom as an older comparison stored it (an insertion of two spaces, not what today's derives)
    spaces = replace(diverged, symptom=dict(diverged.symptom, edits=[["", "  "]]))
    engine, reference = get_runner("minijinja"), get_runner("hf", workers=2)
    try:
        answers = check_known_causes(causes, engine, reference)
        stale = {cause_id: answer for cause_id, answer in answers.items() if isinstance(answer, str)}
        assert stale == {}
        [answer] = check_known_causes([spaces], engine, reference).values()
        assert not isinstance(answer, str), answer
        # A reproducer that really stopped differing is still news.
        repro = dict(spaces.repro, template="{{ '' }}")
        [answer] = check_known_causes([replace(spaces, repro=repro)], engine, reference).values()
        assert answer == "its reproducer no longer differs as recorded (now: match)"
    finally:
        engine.close()
        reference.close()
