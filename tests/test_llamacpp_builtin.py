"""llama.cpp without --jinja (`llamacpp-builtin`): the port of its format detection against llama.cpp's own test
cases and the real server, and the runner on corpus templates it renders right, wrongly and refuses."""
from __future__ import annotations

import pytest

from runners.base import Raised, RefusalKind, Rendered, RenderRequest
from runners.llamacpp import LlamaCppBuiltinRunner, build_llama_server
from runners.llamacpp.builtin import (
    BUILTIN_NAMES,
    CHATML_TEMPLATE_SRC,
    detect,
    server_source,
)
from runners.llamacpp.builtin_runner import PROBE

# The conversation every case of tests/test-chat-template.cpp renders (:355-362), the runner's format probe.
CONVERSATION = PROBE.messages
RIGHT, WRONG, REFUSED = "01-ai-yi-coder-9b-chat", "bananamind-bananamind-2-medium-chat", "microsoft-dialogpt-medium"


@pytest.fixture(scope="module")
def builtin():
    build_llama_server()
    with LlamaCppBuiltinRunner(timeout=20.0, workers=2) as runner:
        yield runner


def test_the_port_detects_every_case_of_llama_cpps_own_test(llama_cpp_cases):
    assert len(llama_cpp_cases) >= 36
    for case in llama_cpp_cases:
        detection = detect(case["template_str"])
        assert detection.name in BUILTIN_NAMES, (case["name"], detection)


def test_the_server_renders_llama_cpps_expected_outputs_and_agrees_with_the_port(builtin, llama_cpp_cases):
    requests = [RenderRequest.make(case["template_str"], CONVERSATION + case["extra_conversation"],
                                   bos_token=case.get("bos_token") or None, eos_token=case.get("eos_token") or None,
                                   add_generation_prompt=True, template_id=f"case-{i}")
                for i, case in enumerate(llama_cpp_cases)]
    outcomes = list(builtin.render_many(requests))
    facts = builtin.template_facts()
    for i, (case, outcome) in enumerate(zip(llama_cpp_cases, outcomes)):
        assert outcome == Rendered(case["expected_output"]), case["name"]
        # the port's format, forced with --chat-template, renders the probe exactly as the template does
        assert facts[f"case-{i}"]["builtin_format"] == detect(case["template_str"]).name
        assert facts[f"case-{i}"]["server_check"] == "agrees", (case["name"], facts[f"case-{i}"])


def test_detection_rules_and_source_normalisation():
    assert detect("{{ '<|im_start|>' }}[INST]").name == "chatml"           # rule order: ChatML first
    assert detect("mistral anything").name == "llama2"                      # the text starts with 'mistral'
    assert detect("gemma").name == "gemma"                                   # a format's exact name
    assert detect("").name == "chatml" and detect("chatml").name == "chatml"  # no template: llama.cpp's ChatML
    assert server_source("a\r\nb\rc\n") == "a\nb\nc"                        # CR/CRLF to LF, one final LF dropped
    assert server_source("x\n\n") == "x\n"
    assert server_source("") == CHATML_TEMPLATE_SRC
    assert detect("<|user|>{{ m }}</s><|assistant|>").name == "falcon3"
    assert detect("<|user|>{{ m }}<|assistant|>").name == "glmedge"         # Zephyr's layout without '</s>'
    unknown = detect("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert unknown.name is None and not unknown.recognised


def _run_basic(runner, template_ids):
    from conformance.checkrun import check_cells
    from conformance.judge.pipeline import Selection

    selection = Selection.load(templates=template_ids, cases=["chat-single-user", "chat-system", "chat-multi-turn"])
    return check_cells(runner, selection.cells(), tokens=False)


def test_a_template_it_detects_right_and_one_it_renders_wrongly(builtin):
    # 01-ai-yi-coder-9b-chat is plain ChatML: the built-in chatml format renders it byte for byte.
    # bananamind-bananamind-2-medium-chat is Zephyr-style (<|user|>, <|assistant|>) without a literal '</s>',
    # so llama.cpp takes it for GLM-Edge, which ends no turn with a newline: the prompt differs from the
    # reference's without any error.
    results = _run_basic(builtin, [RIGHT, WRONG])
    facts = results.info["template_facts"]
    assert facts[RIGHT]["builtin_format"] == "chatml"
    assert facts[WRONG]["builtin_format"] == "glmedge"
    assert all(f["server_check"] == "agrees" for f in facts.values())
    statuses = {}
    for result in results.results:
        statuses.setdefault(result.template_id, set()).add(str(result.status))
    assert statuses == {RIGHT: {"match"}, WRONG: {"diverged"}}
    wrong = next(r for r in results.results if r.key == (WRONG, "chat-single-user"))
    assert wrong.output == "<|user|>\nHello! What is the capital of France?<|assistant|>"


def test_an_unrecognised_template_and_tools_are_refused_as_unsupported(builtin):
    unrecognised = RenderRequest.make("{% for m in messages %}{{ m.content }}{% endfor %}",
                                      [{"role": "user", "content": "x"}])
    outcome = builtin.render(unrecognised)
    assert outcome == Raised("this custom template is not supported, try using --jinja", RefusalKind.UNSUPPORTED)
    with_tools = RenderRequest.make(CHATML_TEMPLATE_SRC, [{"role": "user", "content": "x"}],
                                    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert builtin.render(with_tools) == Raised("tools param requires --jinja flag", RefusalKind.UNSUPPORTED)


def test_unsupported_refusals_never_match_a_reference_refusal():
    from conformance.judge.goldens import Golden
    from conformance.judge.classify import classify
    from conformance.judge.status import Status

    refusal = Raised("this custom template is not supported, try using --jinja", RefusalKind.UNSUPPORTED)
    assert classify(Golden("rendered", b"x"), refusal).status == Status.ENGINE_RAISED
    # a render-kind refusal would match the reference's TypeError; the engine's refusal is of another kind
    assert classify(Golden("raised", b"TypeError: bad"), refusal).status == Status.RAISED_DIFFERENTLY


def test_the_report_shows_the_detected_format_per_template(builtin, tmp_path):
    from conformance.report import build_report, check_report, write_outputs
    from conformance.report.render import markdown

    results = _run_basic(builtin, [RIGHT, WRONG, REFUSED])
    report = build_report([results], {"templates": [], "cases": []}, {"cases": {}, "templates": {}})
    check_report(report)
    section = report["runners"]["llamacpp-builtin"]
    assert section["template_facts"][REFUSED]["builtin_format"] is None
    assert section["basic"]["templates"] == {RIGHT: "right", WRONG: "wrong", REFUSED: "refused"}
    assert section["basic"]["by_format"]["glmedge"]["wrong"] == 1
    assert "| llamacpp-builtin | 1 | 1 | 1 | 0 |" in markdown(report)
    (html,) = write_outputs(report, html_path=tmp_path / "report.html")
    page = html.read_text(encoding="utf-8")
    assert "not recognised" in page and "glmedge" in page
