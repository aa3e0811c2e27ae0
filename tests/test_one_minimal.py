"""Every stored reproducer is small and 1-minimal: at most MAX_LINES template lines, and, rendered again
through its engine, it still differs from the reference while no single registered reduction step
(conformance/explain/minimal.py) keeps that difference. A reproducer exempt from either says why here
(WHY_NOT), and an exemption nothing needs any more fails the test, so the list stays true.

Sizes are checked for every baseline (reading the files only). 1-minimality is checked by rendering for every
baseline but llama.cpp's built-in formats (its reproducers are cut by the detection port, not by these steps),
on each engine's reduction runner where it offers one. A failure lists
every reproducer that is not 1-minimal with the step that still reproduces.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conformance.explain import template as tpl
from conformance.explain.minimal import SHRINKS, candidates, is_one_minimal
from runners import get_runner

EXPECTATIONS = Path(__file__).resolve().parent.parent / "conformance" / "expectations"
MAX_LINES = 10
BASELINES = sorted(p.stem for p in EXPECTATIONS.glob("*.json"))
# Baselines recorded by mechanism, every reproducer reduced to 1-minimal (`chatgold expectations update
# --runner R --reexplain`, reasons carried over): held to both checks.
# The others were finished by `chatgold expectations minimize` (conformance/explain/finish.py): every reproducer
# taken down to 1-minimal and keyed again by mechanism. Each is rendered again here, every candidate step too
# (llama.cpp and Ollama's llama.cpp route on their reduction runners, the in-process route tested against
# llama-server).
RE_RECORDED = {"minijinja", "hfjs", "paperkiln", "ferrox", "chatml-builtin", "llama-cpp-python", "mistralrs",
               "tgi", "llamacpp", "sglang", "vllm", "mistralrs-server", "ollama"}
# Baselines whose reproducers exceed MAX_LINES; a strict xfail, so shrinking one makes this list wrong until it
# is taken out. ollama: 1 of its 15 (34 non-blank lines), a Go-template cause: Ollama renders its own Go template for a
# Jinja text within Levenshtein distance 99 of an index entry's, so a template that picks gemma3-instruct (1,532
# characters) has at least 1,433; the stored one has exactly that (test below). It cannot get smaller; fewer lines
# would be the same characters reflowed (each newline dropped spends one of the 99 edits), not a smaller input.
OVERSIZED = {"ollama": "ollama's Go-template cause is at the smallest size Ollama's choice of its Go template "
                      "allows (1,433 characters, 34 lines)"}
# runner -> {cause id, or "*" for all: why its reproducer may exceed MAX_LINES}: only an engine that never
# evaluates the template (so no smaller template is the same input to it) may keep a whole one.
WHY_NOT = {
    "paperkiln": {"*": "paperkiln resolves a template to a record by the sha256 of its exact text: any smaller "
                       "template is unknown to it (\"raw completion only\"), so the whole template is the "
                       "reproducer; only the conversation is reduced"},
}

# runner -> {cause id: why its reproducer is not 1-minimal}
NOT_MINIMAL: dict = {}


def _causes(runner_name: str) -> list:
    return json.loads((EXPECTATIONS / f"{runner_name}.json").read_text())["causes"]


def _exempt(runner_name: str, cause_id: str) -> bool:
    exempt = WHY_NOT.get(runner_name, {})
    return "*" in exempt or cause_id in exempt


@pytest.fixture(scope="module")
def reference():
    runner = get_runner("hf", workers=2)
    yield runner
    runner.close()


def _size_params():
    for name in BASELINES:
        marks = [pytest.mark.xfail(strict=True, reason=OVERSIZED[name])] if name in OVERSIZED else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("runner_name", list(_size_params()))
def test_every_stored_reproducer_is_at_most_ten_lines(runner_name):
    causes = _causes(runner_name)
    over = [f"{c['id']} ({tpl.lines_of(c['repro']['template'])} lines)" for c in causes
            if c.get("repro") and tpl.lines_of(c["repro"]["template"]) > MAX_LINES
            and not _exempt(runner_name, c["id"])]
    assert not over, f"{len(over)} of {len(causes)} stored reproducers exceed {MAX_LINES} template lines:\n" + \
        "\n".join(over)
    assert all(c.get("repro") for c in causes), "a cause without a reproducer"


def test_every_exemption_is_needed_and_says_why():
    for name, exempt in WHY_NOT.items():
        causes = _causes(name)
        sizes = {c["id"]: tpl.lines_of(c["repro"]["template"]) for c in causes}
        for cause_id, reason in exempt.items():
            assert reason, f"{name} {cause_id}: exempt without a reason"
            needed = any(lines > MAX_LINES for lines in sizes.values()) if cause_id == "*" else \
                sizes.get(cause_id, 0) > MAX_LINES
            assert needed, f"{name} {cause_id} needs no exemption any more"


def test_an_oversized_go_template_reproducer_is_as_small_as_ollamas_choice_allows():
    """What keeps ollama in OVERSIZED: each of its reproducers over MAX_LINES is one for which Ollama renders its
    own Go template, picked by distance, and has no character more than the smallest text that picks it."""
    from runners.ollama import selection

    over = [c for c in _causes("ollama") if tpl.lines_of(c["repro"]["template"]) > MAX_LINES]
    assert over
    for cause in over:
        template = cause["repro"]["template"]
        choice = selection.choose(template)
        assert choice.route == selection.ROUTE_GO, (cause["id"], choice)
        entry = next(text for name, text in selection.index()
                     if name == choice.template and selection.bounded_distance(template, text) == choice.distance)
        # Levenshtein distance is at least the length difference: no text under this length is near enough
        assert len(template) == len(entry) - (selection.CUTOFF - 1), (cause["id"], len(template), len(entry))


def _available(name: str) -> bool:
    return name != "hfjs" or shutil.which("node") is not None


@pytest.mark.parametrize("runner_name", sorted(RE_RECORDED))
def test_every_stored_reproducer_is_one_minimal(runner_name, reference):
    if not _available(runner_name):
        pytest.skip(f"{runner_name}'s engine is not installed here")
    causes = _causes(runner_name)
    # Template steps too for an engine exempt from the size check (paperkiln): that no smaller template keeps
    # its difference is what the exemption claims, so it is rendered, not assumed (about 30 s for its 11).
    failures, excused = [], []
    with get_runner(runner_name, workers=2) as engine:
        renderer = engine.reduction_runner() or engine
        for cause in causes:
            verdict = is_one_minimal(cause["repro"], renderer, reference)
            if verdict:
                continue
            if cause["id"] in NOT_MINIMAL.get(runner_name, {}):
                excused.append(cause["id"])
                continue
            step = verdict.kept[0][0] if verdict.kept else verdict.reason
            failures.append(f"{cause['id']} ({tpl.lines_of(cause['repro']['template'])} lines): {step}")
    assert not failures, f"{len(failures)} of {len(causes)} stored reproducers are not 1-minimal:\n" + \
        "\n".join(failures)
    stale = set(NOT_MINIMAL.get(runner_name, {})) - set(excused)
    assert not stale, f"excused as not 1-minimal, but 1-minimal (or gone): {sorted(stale)}"


def test_the_registry_offers_every_kind_of_step():
    """Template and data steps, a shortened path among them (`tools[0].function` -> `tools[0]`)."""
    assert {"drop-node", "smaller-block", "simpler-expression", "shorter-literal", "shorter-text", "drop-message",
            "drop-field", "smaller-value"} <= set(SHRINKS)
    conversation = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}],
                    "tools": [{"function": {"name": "f"}}], "documents": None, "add_generation_prompt": True,
                    "continue_final_message": False, "kwargs": {"x": 1}, "now": "2025-06-15T09:30:00+00:00"}
    listed = candidates("{{ tools[0].function|tojson }}", conversation)
    sources = {source for _, _, source, _, _ in listed}
    assert "{{ tools[0]|tojson }}" in sources and "{{ tools[0].function }}" in sources
    steps = {name for _, name, _, _, _ in listed}
    assert {"drop-message", "drop-field", "smaller-value", "simpler-expression", "drop-node"} <= steps
    sizes = [measure for measure, *_ in listed]
    assert sizes == sorted(sizes)   # smallest first


def test_a_null_or_a_boolean_shrinks_to_an_empty_string():
    """`content: null` and a boolean argument stand for "some value" as "" does: each is offered as "" (a
    difference needing null itself, null content printed as "", does not keep with it)."""
    conversation = {"messages": [{"role": "assistant", "content": None,
                                  "tool_calls": [{"function": {"name": "f", "arguments": {"on": True}}}]}],
                    "tools": None, "documents": None, "add_generation_prompt": False,
                    "continue_final_message": False, "kwargs": {"think": False}, "now": "2025-06-15T09:30:00+00:00"}
    offered = [c for _, name, _, c, _ in candidates("{{ messages | tojson }}", conversation) if name == "smaller-value"]
    message = lambda c: c["messages"][0]
    assert any(message(c).get("content") == "" for c in offered)
    assert any(message(c).get("tool_calls") == [{"function": {"name": "f", "arguments": {"on": ""}}}]
               for c in offered)
    assert any(c["kwargs"] == {"think": ""} for c in offered)


def test_a_renamed_literal_is_held_to_the_first_edit_found_as_the_candidates_is():
    """A candidate that shortened a literal printed beside the difference keeps it when its first edit is the
    target's with the literal renamed: found by the same windowed, word-widened search as the candidate's own
    (a whole-text diff's first edit is another edit here: `Xb` -> `X<b` is a change of the word, not `<`
    inserted)."""
    from conformance.explain.minimal import keeps
    from conformance.explain.signature import diverged
    from runners.base import Rendered

    pair = (Rendered("Xb"), Rendered("X<b"))
    target = diverged("Xb", "X<b")
    assert keeps(diverged("Qb", "Q<b"), target, pair, ("X", "Q"))
    assert not keeps(diverged("Qb", "Q>b"), target, pair, ("X", "Q"))


def test_a_step_leaving_a_bound_name_undefined_is_no_candidate():
    """Dropping `{% set task_prompt %}...{% endset %}` while `task_prompt` is still printed would show how the
    engines print an undefined name (hfjs's `undefined` against jinja2's `Undefined`: the same quote-style first
    edit as a dict printed as JSON), a difference of its own: no step offers it, and the reducer refuses it."""
    from conformance.explain.minimal import unbinds

    source = ("{%- set task_prompt -%}{{ messages[0].content }}{%- endset -%}"
              "{%- set rows = [{'': task_prompt}] -%}{%- for row in rows %}{{- row }}{%- endfor %}")
    conversation = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "tools": None,
                    "documents": None, "add_generation_prompt": False, "continue_final_message": False,
                    "kwargs": {}, "now": "2025-06-15T09:30:00+00:00"}
    offered = {candidate for _, _, candidate, _, _ in candidates(source, conversation)}
    assert offered and not any("task_prompt" in c and "set task_prompt" not in c for c in offered)
    assert unbinds(source, source.split("{%- endset -%}")[1], conversation)
    assert not unbinds(source, "{{ messages[0].content }}", conversation)


# A template that checks its conversation, the way many corpus templates do: the reference refuses a system
# message; otherwise it prints its own format.
CHECKING = """{%- for message in messages %}
  {%- if message.role == 'system' %}
    {{- raise_exception('System messages are not allowed.') }}
  {%- endif %}
  {{- '<|' + message.role + '|>' + message.content }}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|assistant|>' }}
{%- endif %}
"""


def _reduce(source: str, messages: list, engine, reference):
    from conformance.explain.driver import drive, render_pairs
    from conformance.explain.reduce import Reduction
    from conformance.explain.signature import compare
    from runners.base import Conversation, RenderRequest

    request = RenderRequest(source, Conversation(messages=messages, add_generation_prompt=True), "<s>", "</s>",
                            "t", "c")
    (pair,) = render_pairs(reference, engine, [request])
    target = compare(*pair)
    assert target is not None and target.differs
    return drive([("c", Reduction(request, target))], reference, engine)["c"]


def _as_repro(found) -> dict:
    request = found.request
    return {"template": request.template, "case": request.conversation.to_dict(), "bos_token": request.bos_token,
            "eos_token": request.eos_token}


def test_an_engine_that_ignores_the_template_gets_a_one_line_reproducer(reference):
    """chatml-builtin never reads the template: the difference is the reference's side, which changes with
    every smaller template. Its reproducer is still reduced (to the one line that refuses, or to nothing when
    both render), not kept whole as the old reducer did (39 of its 58 stored reproducers were over 10 lines,
    the largest 643), and it is 1-minimal with the template steps applied."""
    with get_runner("chatml-builtin", workers=1) as engine:
        refused = _reduce(CHECKING, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                          engine, reference)
        assert refused.ignores_template and refused.complete
        assert refused.template.strip() == "{{- raise_exception('System messages are not allowed.') }}", \
            refused.template
        assert refused.reference.kind == "raised" and refused.engine.kind == "rendered"
        diverged = _reduce(CHECKING, [{"role": "user", "content": "Hi"}], engine, reference)
        assert diverged.ignores_template and tpl.lines_of(diverged.template) <= 1, diverged.template
        assert diverged.reference.text != diverged.engine.text
        for found in (refused, diverged):
            verdict = is_one_minimal(_as_repro(found), engine, reference)
            assert verdict, verdict.kept[:1] or verdict.reason
        # The whole template is not 1-minimal for it: a template step keeps the difference.
        whole = is_one_minimal({**_as_repro(refused), "template": CHECKING}, engine, reference)
        assert not whole and any(SHRINKS[name][0] == "template" for name, _, _ in whole.kept)


def test_an_engine_keying_templates_by_their_text_is_keyed_by_its_own_refusal(reference):
    """paperkiln evaluates no template: it finds a record by the sha256 of the template's exact text, so its
    reducer reduces only the case, and the template's constructs play no part in its refusal. The same record
    rule refused under two templates it knows is one cause (keyed as an ignored template's), not one per
    template titled by that template's `|tojson` or `|trim` (seven of its causes were such pairs)."""
    from conformance.explain import cluster

    stored = {c["repro"]["template"] for c in _causes("paperkiln")}
    assert len(stored) == 2   # Gemma 3's and Qwen2.5's, the two known texts the causes need
    keys = set()
    with get_runner("paperkiln", workers=1) as engine:
        for template in sorted(stored):
            found = _reduce(template, [{"role": "assistant", "content": "Hi"}], engine, reference)
            assert found.ignores_template and found.template == template
            assert "message 0 is assistant" in found.engine.message
            keys.add(cluster.cause_key(found.symptom, cluster.constructs_of(found.template), found.reference,
                                       found.engine, found.ignores_template))
            assert cluster.title(found.symptom, cluster.constructs_of(found.template), found.reference,
                                 found.engine, found.ignores_template).startswith("the engine ignores the template")
    assert len(keys) == 1
    refusals = [c["repro"]["engine"]["message"] for c in _causes("paperkiln")]
    assert len(set(refusals)) == len(refusals), "two causes of one paperkiln refusal"
