"""The evaluator against the real reference (transformers in-process) on the real template corpus."""
from __future__ import annotations

import pytest
from test_evaluator_support import CONVERSATIONS, real_templates

from runners.base import Raised, Rendered, RenderRequest
from runners.evaluator import (
    ChatTemplate,
    InputError,
    ReservedVariableError,
    TemplateCompileError,
    TemplateRefusal,
    TemplateRenderError,
)
from runners.evaluator.runner import EvaluatorRunner

TEMPLATES = real_templates()


@pytest.fixture(scope="module")
def hf():
    from runners.hf import HFRenderer

    return HFRenderer()


@pytest.fixture(scope="module")
def evaluator():
    with EvaluatorRunner() as runner:
        yield runner


def assert_same(reference, ours, label):
    if isinstance(reference, Rendered):
        assert isinstance(ours, Rendered), f"{label}: HF rendered, evaluator gave {ours}"
        assert ours.text == reference.text, f"{label}: output differs"
    else:
        assert isinstance(reference, Raised), f"{label}: unexpected reference outcome {reference}"
        assert isinstance(ours, Raised), f"{label}: HF raised {reference.message!r}, evaluator gave {ours}"
        # Exact message, type name included (recursion messages depend on the stack depth at the limit).
        if not reference.message.startswith("RecursionError"):
            assert ours.message == reference.message, label
        else:
            assert ours.message.startswith("RecursionError"), label


def test_corpus_is_found():
    if not TEMPLATES:
        pytest.skip("no real templates: templates/manifest.json is missing and the llama.cpp source cache is absent")
    assert len(TEMPLATES) >= 50


@pytest.mark.parametrize("template_id", sorted(TEMPLATES))
def test_real_template_matches_hf(template_id, hf, evaluator):
    source = TEMPLATES[template_id]
    for case_id, conversation in CONVERSATIONS.items():
        request = RenderRequest.make(source, template_id=template_id, case_id=case_id, **conversation)
        assert_same(hf.render(request), evaluator.render(request), request.cell())


MESSAGES = [{"role": "user", "content": "hi"}]
SIMPLE = "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"

EDGE_REQUESTS = {
    "empty-conversation": RenderRequest.make(SIMPLE, []),
    "non-dict-message": RenderRequest.make(SIMPLE, ["hello"]),
    "continue-and-generation-prompt": RenderRequest.make(SIMPLE, MESSAGES, add_generation_prompt=True,
                                                    continue_final_message=True),
    "continue-missing-field": RenderRequest.make("{{ messages[0].role }}", MESSAGES, continue_final_message=True),
    "continue-trimmed": RenderRequest.make("{% for m in messages %}{{ m.content|trim }}|{% endfor %}",
                                      [{"role": "assistant", "content": "abc  "}], continue_final_message=True),
    "continue-content-list": RenderRequest.make("{% for m in messages %}{% for b in m.content %}{{ b.text }}{% endfor %}"
                                           "{% endfor %}", [{"role": "assistant", "content": [{"type": "text",
                                                                                              "text": "pre"}]}],
                                           continue_final_message=True),
    "tools-not-dicts": RenderRequest.make(SIMPLE, MESSAGES, tools=["get_weather"]),
    "documents-not-dicts": RenderRequest.make(SIMPLE, MESSAGES, documents=["doc"]),
    "none-values-dropped": RenderRequest.make("{{ messages[0] }}", [{"role": "user", "content": None, "x": 1}]),
    "reasoning-aliases": RenderRequest.make("{{ messages[0]|tojson }}", [{"role": "assistant", "content": "a",
                                                                     "reasoning": "r"}]),
    "syntax-error": RenderRequest.make("line one\n{% for %}", MESSAGES),
    "unknown-filter": RenderRequest.make("{{ x|nofilter }}", MESSAGES),
    "refusal": RenderRequest.make("{{ raise_exception('Only user roles, got ' ~ messages[0].role) }}", MESSAGES),
    "undefined-attribute": RenderRequest.make("{{ x.y }}", MESSAGES),
    "type-error": RenderRequest.make("{{ 'a' + 1 }}", MESSAGES),
    "strftime-frozen": RenderRequest.make("{{ strftime_now('%Y-%m-%d %H:%M %A') }}", MESSAGES,
                                     now="2024-12-31T23:30:00-02:00"),
    "tojson-options": RenderRequest.make("{{ tools|tojson(indent=2, sort_keys=True) }}{{ 'é<'|tojson }}", MESSAGES,
                                    tools=[{"b": 1, "a": "ü"}]),
    "dict-global": RenderRequest.make("{{ dict(a=1, b=[2]) }}{{ dict.fromkeys(['x'], 0) }}", MESSAGES),
    "namespace-underscore": RenderRequest.make("{% set ns = namespace(_a=1) %}", MESSAGES),
    "namespace-write": RenderRequest.make("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                                     "{% endfor %}{{ ns.n }}", MESSAGES),
    "sandbox-attribute": RenderRequest.make("{{ messages.__class__.__mro__ }}", MESSAGES),
    "sandbox-mutation": RenderRequest.make("{{ messages.append(1) }}", MESSAGES),
    "generation-tag": RenderRequest.make("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}"
                                    "{% endfor %}", MESSAGES),
    "loopcontrols": RenderRequest.make("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}"
                                  "{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", MESSAGES),
    "special-tokens-only-given": RenderRequest.make("{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}",
                                               MESSAGES, bos_token="<s>"),
    "kwarg-overrides-eos": RenderRequest.make("{{ eos_token }}", MESSAGES, eos_token="</s>", kwargs={"eos_token": "E"}),
    "consumed-kwarg": RenderRequest.make("{{ max_length is defined }}", MESSAGES, kwargs={"max_length": 5}),
    "recursion": RenderRequest.make("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", MESSAGES),
    "range-cap": RenderRequest.make("{{ range(200000)|length }}", MESSAGES),
}
for key in ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize",
            "chat_template", "conversation", "self", "conversations", "return_assistant_tokens_mask",
            "sanitize_control_tokens"):
    EDGE_REQUESTS[f"kwarg-{key}"] = RenderRequest.make(SIMPLE, MESSAGES, kwargs={key: True})


@pytest.mark.parametrize("case_id", sorted(EDGE_REQUESTS))
def test_edge_case_matches_hf(case_id, hf, evaluator):
    request = EDGE_REQUESTS[case_id]
    assert_same(hf.render(request), evaluator.render(request), case_id)


def test_typed_errors():
    with pytest.raises(TemplateCompileError) as compile_error:
        ChatTemplate.from_string("ok\n{{ x + }}")
    assert compile_error.value.lineno == 2 and "line 2" in str(compile_error.value)

    refusing = ChatTemplate.from_string("a\n{{ raise_exception('no system role') }}")
    with pytest.raises(TemplateRefusal) as refusal:
        refusing.render(MESSAGES)
    assert refusal.value.template_message == "no system role" and refusal.value.lineno == 2

    failing = ChatTemplate.from_string("a\n\n{{ messages[0].content.split('x', 'y') }}")
    with pytest.raises(TemplateRenderError) as render_error:
        failing.render(MESSAGES)
    assert render_error.value.lineno == 3 and "method:split" in render_error.value.constructs
    assert render_error.value.reference_type == "TypeError"

    with pytest.raises(ReservedVariableError, match="messages"):
        ChatTemplate.from_string(SIMPLE).render(MESSAGES, kwargs={"messages": []})
    with pytest.raises(InputError, match="empty conversation"):
        ChatTemplate.from_string(SIMPLE).render([])
