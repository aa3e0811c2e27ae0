"""The vllm runner: each step vLLM 0.33.0's chat route takes before and around transformers' apply_chat_template.

Every request below is rendered by the runner (the wheel's own chat layer, runners/vllm_wheel.py) and by the
cited reproduction (runners/vllm_runner.py, ReproducedRenderer, in this process); each expected text is what
that step makes of the request and differs from what transformers alone renders, so the test fails if the step
were left out of either. Requests the reproduction does not cover (pydantic's validation) check the runner only.
"""
from __future__ import annotations

import pytest

from runners.base import Raised, RefusalKind, Rendered, RenderRequest, Skipped

LOOP_ROLES = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": 1}'}}

# (name, template, messages, extra conversation fields, vLLM's text, transformers' text)
STEPS = [
    ("none-content-is-no-parts",  # chat_message.py:631-632: None is an empty list of parts (openai format here)
     "{% for m in messages %}[{{ m.content is string }}{% for p in m.content %}{{ p.text }}{% endfor %}]{% endfor %}",
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}], {},
     "[Falseq][False]", "[True][False]"),
    ("string-format-joins-parts",  # chat_message.py:419-430: the "string" format joins text parts with "\n"
     "{{ messages[0].content }}",
     [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], {},
     "a\nb", "[{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}]"),
    ("openai-format-wraps-string",  # hf.py:579-597 detects the loop; chat_message.py:633-634 wraps the string
     "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}",
     [{"role": "user", "content": "hi"}], {},
     "<hi>", "<><>"),
    ("detection-follows-namespace-alias",  # hf.py:442-473: `ns.rest = messages` is still the messages
     "{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}{% for p in m.content %}<{{ p.text }}>"
     "{% endfor %}{% endfor %}",
     [{"role": "user", "content": "hi"}], {},
     "<hi>", "<><>"),
    ("arguments-json-loaded",  # chat_message.py:733-769
     "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments is mapping }}"
     "{{ c.function.arguments.q }}{% endfor %}{% endfor %}",
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}], {},
     "True1", "False"),
    ("invalid-arguments-become-empty-object",  # chat_message.py:741-753
     "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments|tojson }}{% endfor %}"
     "{% endfor %}",
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}], {},
     "{}", '"{not json"'),
    ("empty-tool-calls-dropped",  # chat_message.py:711-714
     "{{ 'tool_calls' in messages[1] }}",
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": []}], {},
     "False", "True"),
    ("unknown-message-keys-dropped",  # chat_message.py:646-696 builds the message from named keys only
     "{{ messages[0].extra is defined }}",
     [{"role": "user", "content": "q", "extra": 1}], {},
     "False", "True"),
    ("reasoning-content-renamed",  # protocol.py:580-601 and chat_message.py:655-660
     "{{ messages[1].reasoning }}|{{ messages[1].reasoning_content }}|{{ messages[0].reasoning_content }}",
     [{"role": "user", "content": "q", "reasoning_content": "u"},
      {"role": "assistant", "content": "a", "reasoning_content": "r"}], {},
     "r|r|", "|r|u"),
    ("null-content-assistant-loses-reasoning",  # protocol.py:238: content null validates as openai's assistant
     "{{ messages[1].reasoning_content }}|{{ messages[2].reasoning_content }}",
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "reasoning_content": "r"},
      {"role": "assistant", "content": "a", "reasoning_content": "s"}], {},
     "|s", "r|s"),
    ("developer-becomes-system",  # hf.py:600-656 at :889-899
     LOOP_ROLES,
     [{"role": "system", "content": "A"}, {"role": "developer", "content": "B"}, {"role": "user", "content": "C"}],
     {}, "system:A\n\nB;user:C;", "system:A;developer:B;user:C;"),
    ("tools-dumped-by-the-request-model",  # protocol.py:206-223, generate/base/protocol.py:298-316
     "{{ tools[0]|tojson }}",
     [{"role": "user", "content": "q"}],
     {"tools": [{"type": "function", "function": {"description": "d", "name": "f", "extra": 1}}]},
     '{"type": "function", "function": {"name": "f", "description": "d", "parameters": null}}',
     '{"type": "function", "function": {"description": "d", "name": "f", "extra": 1}}'),
    ("unset-kwargs-dropped",  # params.py:38-50: a chat_template_kwargs value None or "auto" is left out
     "{{ a is defined }}|{{ b is defined }}|{{ c }}",
     [{"role": "user", "content": "q"}], {"kwargs": {"a": None, "b": "auto", "c": "kept"}},
     "False|False|kept", "True|True|kept"),
]


def _request(template, messages, extra):
    return RenderRequest.make(template, messages, add_generation_prompt=True, **extra)


@pytest.fixture(scope="module")
def runner():
    from runners import get_runner
    from runners.versions import installed_venv
    from runners.vllm_wheel import REQUIREMENTS, WHEEL_VERSION, sources_dir

    if installed_venv(f"vllm-{WHEEL_VERSION}", REQUIREMENTS) is None or not sources_dir().exists():
        pytest.fail("vLLM's chat layer is not in the cache: run scripts/setup.sh (tests never download)")
    with get_runner("vllm") as made:
        yield made


@pytest.fixture(scope="module")
def runner_outcomes(runner):
    requests = [_request(t, m, e) for _, t, m, e, _, _ in STEPS]
    return dict(zip([s[0] for s in STEPS], runner.render_many(requests)))


@pytest.mark.parametrize("name, template, messages, extra, expected, plain", STEPS, ids=[s[0] for s in STEPS])
def test_step_in_the_runner(runner_outcomes, name, template, messages, extra, expected, plain):
    assert runner_outcomes[name] == Rendered(expected)


@pytest.mark.parametrize("name, template, messages, extra, expected, plain", STEPS, ids=[s[0] for s in STEPS])
def test_step_in_the_reproduction(name, template, messages, extra, expected, plain):
    from runners.vllm_runner import ReproducedRenderer

    assert ReproducedRenderer().render(_request(template, messages, extra)) == Rendered(expected)


@pytest.mark.parametrize("name, template, messages, extra, expected, plain", STEPS, ids=[s[0] for s in STEPS])
def test_transformers_alone_renders_otherwise(name, template, messages, extra, expected, plain):
    """The other half of 'fails if the step were removed': without vLLM's step, transformers prints `plain`."""
    from runners.hf import HFRenderer

    assert HFRenderer().render(_request(template, messages, extra)) == Rendered(plain)


@pytest.mark.parametrize("renderer", ["runner", "reproduction"])
def test_the_request_model_refuses_object_arguments(request, renderer):
    """vLLM's request model types `arguments` as a string (openai's Function TypedDict): an object is a 400."""
    from runners.vllm_runner import ReproducedRenderer

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"q": 1}}}
    cell = _request(LOOP_ROLES, [{"role": "user", "content": "q"},
                                 {"role": "assistant", "content": None, "tool_calls": [call]}], {})
    if renderer == "runner":
        [outcome] = request.getfixturevalue("runner").render_many([cell])
    else:
        outcome = ReproducedRenderer().render(cell)
    assert isinstance(outcome, Raised) and outcome.refusal == RefusalKind.RENDER
    assert outcome.message.startswith("400 Bad Request: ") and "arguments" in outcome.message


def test_template_refusal_keeps_the_templates_message(runner):
    [outcome] = runner.render_many([_request("{{ raise_exception('no system role') }}",
                                             [{"role": "user", "content": "q"}], {})])
    assert outcome == Raised("400 Bad Request: no system role", RefusalKind.RAISE)


def test_both_generation_flags_are_refused(runner):
    request = RenderRequest.make(LOOP_ROLES, [{"role": "assistant", "content": "a"}], add_generation_prompt=True,
                                 continue_final_message=True)
    [outcome] = runner.render_many([request])
    assert isinstance(outcome, Raised) and "Cannot set both" in outcome.message


def test_media_parts_need_a_multimodal_model(runner):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    [outcome] = runner.render_many([_request(LOOP_ROLES, [{"role": "user", "content": [image]}], {})])
    assert isinstance(outcome, Skipped) and "multimodal" in outcome.message


def test_kwargs_filter_keeps_template_and_transformers_names():
    """hf.py:803-831: a kwarg the template does not read and transformers does not take is not passed."""
    from runners.hf import HFRenderer
    from runners.vllm_runner import filter_kwargs

    tokenizer = HFRenderer.tokenizer(None, None)
    kept = filter_kwargs(tokenizer, "{{ used }}", {"used": 1, "unused": 2, "add_generation_prompt": True})
    assert kept == {"used": 1, "add_generation_prompt": True}
