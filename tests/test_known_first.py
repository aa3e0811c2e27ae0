"""Known mechanisms first (causes.look_up): a group whose cells show a mechanism the baseline already names is
explained by rendering that cause's reproducer template with the group's own data, not by a reduction."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from conformance.checkrun import check_cells
from conformance.explain import explain
from conformance.explain.causes import known_mechanisms
from conformance.judge.expectations import KnownCause, _baseline_repro
from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
from runners import get_runner

HARNESS = Path(__file__).parent / "harnesses" / "planted.py"
CASES = ["chat-single-user", "tools-one", "tools-one-system", "tool-call-args-object"]


def planted(bug: str):
    return get_runner("command:" + shlex.join([sys.executable, str(HARNESS), "--bug", bug]), workers=2, timeout=20)


@pytest.fixture(scope="module")
def reference():
    runner = get_runner("hf", workers=2)
    yield runner
    runner.close()


def as_known(cause) -> KnownCause:
    """The cause as a baseline records it (judge.expectations.update_expectations)."""
    data = cause.to_dict()
    return KnownCause(data["id"], data["title"], "the planted bug", "", data["constructs"], data["symptom"],
                      _baseline_repro(data["repro"]))


def test_a_known_mechanism_explains_a_new_template_without_reducing_it(reference):
    first = Selection.load(["qwen-qwen2.5-7b-instruct"], CASES).cells()
    second = Selection.load(["axolotl-qwen3"], CASES).cells()
    with planted("tojson-sorts-keys") as engine:
        results = check_cells(engine, first, GoldenJudge())
        recorded = explain(results, engine, reference, requests_by_cell(first))
        assert len(recorded.causes) == 1 and not recorded.unexplained, [c.title for c in recorded.causes]
        known = as_known(recorded.causes[0])
        assert known_mechanisms([known]), "the recorded cause must be testable as a mechanism"

        results = check_cells(engine, second, GoldenJudge())
        afresh = explain(results, engine, reference, requests_by_cell(second))
        first_known = explain(results, engine, reference, requests_by_cell(second), known_causes=[known])
    assert afresh.stats["groups"] >= 1 and not first_known.unexplained
    groups = first_known.stats["groups"]
    assert first_known.stats["known_first"] == {"tested": groups, "matched": groups}
    # the same cause as the baseline's, its cells all of the new template's, found by a few renders
    assert [c.id for c in first_known.causes] == [known.id]
    assert sorted(first_known.causes[0].cells) == sorted(c for cause in afresh.causes for c in cause.cells)
    assert first_known.causes[0].confirmed
    # no template pass ran: the case was reduced on the known reproducer's template, then checked 1-minimal
    assert set(first_known.stats["renders_by_pass"]) <= {"known", "onestep"}, first_known.stats["renders_by_pass"]
    assert first_known.stats["reduction_renders"] < afresh.stats["reduction_renders"], (
        first_known.stats["reduction_renders"], afresh.stats["reduction_renders"])


def test_a_mechanism_whose_construct_the_template_lacks_is_not_tried(reference):
    """The known cause's culprit constructs must all be in the group's template (else its name would be false
    of the group's cells): a `|tojson` cause is no candidate for a template without tojson."""
    from conformance.explain.causes import Group, mechanisms_for
    from conformance.explain.signature import Symptom
    from conformance.judge.status import Status
    from runners.base import Conversation, RenderRequest

    known = KnownCause("c-0000000001", "tojson", "", "", ["filter:tojson"], {"status": "diverged", "edits": [
        ['{"b": 1, "a": 2}', '{"a": 2, "b": 1}']]}, {
        "template": "{{ messages[0].content | tojson }}", "case": {"messages": [{"role": "user", "content": "x"}]},
        "reference": {"kind": "rendered", "text": '"x"'}, "engine": {"kind": "rendered", "text": "'x'"}})
    mechanisms = known_mechanisms([known])
    assert mechanisms
    symptom = Symptom(Status.DIVERGED, frozenset({('"', "'")}), first=('"', "'"))
    conversation = Conversation(messages=[{"role": "user", "content": "x"}])
    with_it = Group(("t", "k"), symptom, request=RenderRequest("{{ messages | tojson }}", conversation))
    without = Group(("t", "k"), symptom, request=RenderRequest("{{ messages[0].content }}", conversation))
    assert mechanisms_for(with_it, mechanisms) == mechanisms
    assert mechanisms_for(without, mechanisms) == []


def test_a_mechanism_keyed_by_a_name_the_template_never_reads_is_not_tried():
    """A cause keyed by what it tests (`tools is not none` printing nothing) is no mechanism of a template that
    never reads `tools`, though its reproducer given that group's data differs alike (ferrox had filed a
    template's `content is not none` cells under it)."""
    from conformance.explain.causes import Group, known_mechanisms, mechanisms_for
    from conformance.explain.signature import Symptom
    from conformance.judge.status import Status
    from runners.base import Conversation, RenderRequest

    known = KnownCause("c-0000000002", "`is none` of `tools`: prints nothing", "", "", ["test:none"], {
        "status": "diverged", "edits": [["t", ""]]}, {
        "template": "{%- if tools is not none %}{{- 't' }}{%- endif %}", "case": {"messages": [{"role": ""}],
                                                                              "tools": []},
        "reference": {"kind": "rendered", "text": "t"}, "engine": {"kind": "rendered", "text": ""}})
    mechanisms = known_mechanisms([known])
    assert mechanisms and mechanisms[0].names == {"test:none", "tools"}
    symptom = Symptom(Status.DIVERGED, frozenset({("t", "")}), first=("t", ""))
    conversation = Conversation(messages=[{"role": "user", "content": None}], tools=[])
    reads_tools = "{% if tools is none %}{% else %}t{% endif %}"
    reads_content = "{% for m in messages %}{% if m.content is not none %}t{% endif %}{% endfor %}"
    assert mechanisms_for(Group(("t", "k"), symptom, request=RenderRequest(reads_tools, conversation)),
                          mechanisms) == mechanisms
    assert mechanisms_for(Group(("t", "k"), symptom, request=RenderRequest(reads_content, conversation)),
                          mechanisms) == []
