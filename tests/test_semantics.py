"""runners/protocol/SEMANTICS.md against the real reference: every rule's example renders as the page says, and
runners.semantics.reference_bindings (what protocol-2 harnesses get as `bindings`) is exactly what
transformers binds."""
from __future__ import annotations

import json
import re

import pytest

from conformance.corpus.cases import load_cases
from runners.base import Raised, Rendered, RenderRequest
from runners.semantics import SEMANTICS_MD, examples, reference_bindings

EXAMPLES = examples()


def example_request(example: dict) -> RenderRequest:
    fields = {k: v for k, v in example.items() if k not in ("template", "expected", "raised", "rule")}
    return RenderRequest.make(example["template"], **fields)


def test_every_rule_is_numbered_in_order_and_most_have_an_example():
    text = open(SEMANTICS_MD, encoding="utf-8").read()
    numbers = [int(n) for n in re.findall(r"^\*\*R(\d+)\.", text, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 24
    with_example = {e["rule"] for e in EXAMPLES}
    # R9 (a boolean bound as given) and R12 (the sum of R4, R11, R22) are shown by the other examples.
    assert {f"R{n}" for n in numbers} - with_example <= {"R9", "R12", "R21", "R24"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e['rule']}-{i}" for i, e in enumerate(EXAMPLES)])
def test_the_example_is_what_the_reference_does(example, hf_renderer):
    outcome = hf_renderer.render(example_request(example))
    if "expected" in example:
        assert isinstance(outcome, Rendered), outcome
        assert outcome.text == example["expected"]
    else:
        assert isinstance(outcome, Raised), outcome
        raised = example["raised"]
        type_name, _, message = outcome.message.partition(": ")
        assert (type_name, str(outcome.refusal)) == (raised["type"], raised["kind"])
        assert message.startswith(raised["message"]), message


# -- reference_bindings against the variables transformers really passes to the template ------------------

def _captured_bindings(hf_renderer, request, monkeypatch):
    """Render through the real reference with its compiled template wrapped so the keyword arguments of
    Template.render are recorded: (outcome, the variables, or None when it refused before rendering)."""
    from transformers.utils import chat_template_utils

    original = chat_template_utils._compile_jinja_template
    seen = []

    class Recording:
        def __init__(self, template):
            self.template = template

        def render(self, *args, **variables):
            seen.append(json.loads(json.dumps(variables)))
            return self.template.render(*args, **variables)

    monkeypatch.setattr(chat_template_utils, "_compile_jinja_template", lambda source: Recording(original(source)))
    try:
        outcome = hf_renderer.render(request)
    finally:
        monkeypatch.setattr(chat_template_utils, "_compile_jinja_template", original)
    return outcome, (seen[0] if seen else None)


CONTENT_TEMPLATE = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
NO_CONTENT_TEMPLATE = "{{ messages|length }}"
LIST = [{"type": "image"}, {"type": "text", "text": "first"}, {"type": "text", "text": "last"}]
EDGE_REQUESTS = [
    dict(messages=[{"role": "user", "content": None, "name": "n", "x": {"y": None}}]),
    dict(messages=[{"role": "assistant", "content": "c", "reasoning": "r", "thinking": None}]),
    dict(messages=[{"reasoning_content": "rc", "role": "assistant", "thinking": "t", "content": "c"}]),
    dict(messages=[{"role": "assistant", "content": "c", "reasoning_content": ""}]),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"bos_token": "K", "padding": 1, "x": None}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"tools": []}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"conversation": 1}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"conversations": 1}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"messages": 1}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"return_assistant_tokens_mask": True}),
    dict(messages=[{"role": "user", "content": "hi"}], kwargs={"sanitize_control_tokens": 1, "return_dict": 0}),
    dict(messages=[]),
    dict(messages=[{"role": "user", "content": "hi"}], tools=[{"a": 1}, "x"]),
    dict(messages=[{"role": "user", "content": "hi"}], documents=[{"title": "t"}, 3]),
    dict(messages=[{"role": "user", "content": "hi"}], tools=[], documents=[]),
    dict(messages=[{"role": "assistant", "content": "a "}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": "a"}], continue_final_message=True, add_generation_prompt=True),
    dict(messages=[{"role": "assistant"}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": LIST}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": [{"type": "image"}]}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": ["some text"]}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": [{"text": 5}]}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": {"k": 1}}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": 7}], continue_final_message=True),
    dict(messages=[{"role": "assistant", "content": "x", "reasoning": "why"}], continue_final_message=True),
]


def _requests():
    for case in load_cases():
        for template in (CONTENT_TEMPLATE, NO_CONTENT_TEMPLATE):
            yield f"{case.id}@{len(template)}", case.request(template, "<s>", "</s>")
    for index, fields in enumerate(EDGE_REQUESTS):
        for template in (CONTENT_TEMPLATE, NO_CONTENT_TEMPLATE):
            yield f"edge{index}@{len(template)}", RenderRequest.make(template, bos_token="<s>", **fields)


@pytest.mark.parametrize("label,request_", list(_requests()), ids=lambda v: v if isinstance(v, str) else "")
def test_reference_bindings_are_what_transformers_binds(label, request_, hf_renderer, monkeypatch):
    _, seen = _captured_bindings(hf_renderer, request_, monkeypatch)
    outcome = hf_renderer.render(request_)  # unwrapped: a refusal's message names the real Template.render
    bindings = reference_bindings(request_)
    if seen is None or (isinstance(outcome, Raised) and "Template.render()" in outcome.message):
        # Refused before the template was rendered: the same refusal, message and all.
        assert isinstance(outcome, Raised), outcome
        assert bindings.get("refused", {}).get("message") == outcome.message
    else:
        assert "refused" not in bindings, bindings
        # Key order is part of what a template sees (tojson, items()): compare the JSON texts.
        assert json.dumps(bindings, sort_keys=False) == json.dumps(seen, sort_keys=False)
