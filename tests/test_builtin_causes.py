"""llamacpp-builtin by cause (explain/formats.py): a non-matching cell's cause is the built-in format llama.cpp
detects for its template and the rule that picked it, with the symptom; one cause per (format, rule, symptom),
each confirmed on the real server, its reproducer the template cut to the text that picks the same format by the
same rule, or, when that cut does not differ as the cells do (the template's own refusal, a construct the server
will not load), the template reduced as Jinja with its format kept (FormatReduction); its conversation reduced."""
from __future__ import annotations

import pytest

from conformance import schema_validator
from conformance.checkrun import check_cells
from conformance.explain import explain
from conformance.explain import template as tpl
from conformance.explain.formats import _llamacpp_detect, cause_id, cut_template, symptom_kind
from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
from conformance.judge.status import NON_MATCHING
from runners import get_runner
from runners.llamacpp import LlamaCppBuiltinRunner, build_llama_server
from runners.llamacpp.builtin import detect

# chatml (right and wrong), llama3, and a template no rule recognises
TEMPLATES = ["01-ai-yi-coder-9b-chat", "qwen-qwen2.5-7b-instruct", "meta-llama-llama-3.1-8b-instruct",
             "microsoft-dialogpt-medium"]
CASES = ["chat-single-user", "chat-system", "chat-multi-turn", "tools-one", "chat-whitespace-padded"]


@pytest.fixture(scope="module")
def explained():
    build_llama_server()
    cells = Selection.load(TEMPLATES, CASES).cells()
    with LlamaCppBuiltinRunner(timeout=20.0, workers=2) as engine, get_runner("hf", workers=2) as reference:
        results = check_cells(engine, cells, GoldenJudge(), tokens=False)
        yield results, explain(results, engine, reference, requests_by_cell(cells)), requests_by_cell(cells)


def test_every_cell_is_under_its_format_cause(explained):
    results, explanation, requests = explained
    failing = {r.key: r for r in results.results if r.status in NON_MATCHING}
    assert len(failing) > 10 and not explanation.unexplained, explanation.unexplained[:3]
    by_cell = explanation.cause_of()
    assert set(by_cell) == set(failing)
    schema_validator("explain.schema.json").validate(explanation.to_dict())
    formats = set()
    cut = 0
    for cause in explanation.causes:
        assert cause.confirmed and cause.id.startswith("c-")
        names = {detect(requests[cell].template) for cell in cause.cells}
        assert len(names) == 1, (cause.title, names)   # one format and rule per cause
        detection = names.pop()
        formats.add(detection.name)
        assert (f"`{detection.name}`" if detection.name else "no built-in format") in cause.title
        assert detection.rule in cause.title
        # one symptom: every cell's shows the cause's kind, and the id is that of (format, rule, kind)
        assert cause.id == cause_id("llamacpp-builtin", detection.name, detection.rule,
                                    symptom_kind(cause.found.symptom))
        # the reproducer's template picks the cause's format by the same rule: cut from a template of the cause,
        # or reduced from it with the format kept; never a whole template; its data reduced
        template = cause.found.request.template
        wholes = {requests[cell].template for cell in cause.cells}
        assert detect(template) == detection
        assert template not in wholes and tpl.lines_of(template) <= 10, (cause.title, template)
        assert len(cause.found.request.messages) <= 2
        cut += template in {cut_template(w, _llamacpp_detect) for w in wholes}
    assert {"chatml", "llama3", None} <= formats
    assert cut >= len(explanation.causes) // 2, cut   # most reproducers are cut, not whole templates
    # one cause per (format, rule, symptom): the tools refusal of chatml templates is one cause, not one per template
    chatml_tools = [c for c in explanation.causes if "`chatml`" in c.title and "tools param" in c.title]
    assert len(chatml_tools) == 1 and chatml_tools[0].templates == 2


# Causes whose difference needs the template's own answer, which the plain cut loses: Mistral v0.1's refusal of a
# role order (23 lines; cut to ` [INST] ` + the refusal's absence the format renders and the template too), and
# Fanar's `{% raw %}`, which llama-server's Jinja parser does not know, so the server exits at start-up (26 lines;
# cut to `<start_of_turn>` the server starts). Both were stored as whole templates.
KEEPING = {"axolotl-mistral_v1": ["non-alternating-users", "chat-single-user"],
           "qcri-fanar-2-27b-instruct": ["chat-single-user"]}


@pytest.fixture(scope="module")
def explained_keeping():
    build_llama_server()
    cells = [cell for template, cases in KEEPING.items() for cell in Selection.load([template], cases).cells()]
    with LlamaCppBuiltinRunner(timeout=20.0, workers=2) as engine, get_runner("hf", workers=2) as reference:
        results = check_cells(engine, cells, GoldenJudge(), tokens=False)
        yield results, explain(results, engine, reference, requests_by_cell(cells)), requests_by_cell(cells)


def test_a_difference_that_needs_the_templates_own_answer_is_cut_small(explained_keeping):
    results, explanation, requests = explained_keeping
    causes = {cause.id: cause for cause in explanation.causes}
    by_cell = explanation.cause_of()
    refused = causes[by_cell[("axolotl-mistral_v1", "non-alternating-users")]]
    exits = causes[by_cell[("qcri-fanar-2-27b-instruct", "chat-single-user")]]
    assert not explanation.unexplained, explanation.unexplained[:3]
    for cause, whole in ((refused, "axolotl-mistral_v1"), (exits, "qcri-fanar-2-27b-instruct")):
        template = cause.found.request.template
        assert cause.confirmed and detect(template) == detect(requests[(whole, KEEPING[whole][0])].template)
        assert tpl.lines_of(template) <= 2 and len(template) < 200, (cause.title, template)
    # the format renders where the template refuses: the reference's own refusal kept, the engine rendering
    assert "the format renders where the template refuses" in refused.title
    assert refused.found.reference.kind == "raised" and "must alternate" in refused.found.reference.message
    assert refused.found.engine.kind == "rendered"
    # the server does not start: kept, with the construct it does not know, on llama-server itself
    assert exits.found.engine.kind == "raised" and "Unknown statement: raw" in exits.found.engine.message
    assert "exited during start-up" in exits.found.engine.message and "{% raw %}" in exits.found.request.template
