"""The sglang runner: SGLang's gateway (sglang-router 0.3.2) rendering a chat request, each step pinned.

No registry package renders a prompt here to check against (docs/engines.md), so every fact the runner
reproduces from the release's source is pinned by a test."""
from __future__ import annotations

import pytest

from runners import RenderRequest, get_runner
from runners.base import Raised, RefusalKind, Rendered, Skipped

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1.0, "a": 2}, "x": 1}}


@pytest.fixture(scope="module")
def sglang():
    with get_runner("sglang") as runner:
        yield runner


def _render(runner, template, messages=USER, **fields):
    fields.setdefault("add_generation_prompt", True)
    return runner.render(RenderRequest.make(template, messages, "<s>", "</s>", **fields))


def test_environment_is_minijinja_new_with_pycompat_and_its_own_tojson(sglang):
    assert _render(sglang, "{% if true %}\nx{% endif %}") == Rendered("\nx")  # no trim_blocks
    assert _render(sglang, "{{ '  a '.strip() }}") == Rendered("a")  # pycompat
    for name in ("raise_exception", "strftime_now"):
        assert _render(sglang, "{{ %s('x') }}" % name) == \
            Raised(f"unknown function: {name} is unknown (in chat:1)", RefusalKind.RENDER)
    assert _render(sglang, "{{ {'b': 1.5e300, 'a': '<x>é', 'c': 0.0}|tojson }}") == \
        Rendered('{"a":"<x>é","b":1.5e+300,"c":0.0}')  # serde_json's float spelling
    assert _render(sglang, "{{ {'b': [1]}|tojson(indent=2, ensure_ascii=False) }}") == \
        Rendered('{\n  "b": [\n    1\n  ]\n}')
    assert _render(sglang, "{{ 1|tojson(indent=-1) }}") == \
        Raised("invalid operation: indent cannot be negative", RefusalKind.RENDER)
    # features the gateway's MiniJinja build lacks, and the binding's contrib extras it never registers
    assert _render(sglang, "{% for x in [1] %}{% break %}{% endfor %}") == \
        Raised("syntax error: unknown statement break (in chat:1)", RefusalKind.COMPILE)
    for template in ("{{ 'a b'|urlencode }}", "{{ 'abc'|truncate(2) }}", "{{ cycler('a') }}"):
        assert isinstance(_render(sglang, template), Raised), template


def test_binds_only_messages_generation_prompt_tools_documents_and_kwargs(sglang):
    probe = "{{ bos_token is defined }}|{{ eos_token is defined }}|{{ tools is none }}|{{ documents is none }}|" \
            "{{ add_generation_prompt }}|{{ foo }}|{{ messages|length }}"
    assert _render(sglang, probe, kwargs={"foo": 3, "messages": "not these", "add_generation_prompt": False}) == \
        Rendered("false|false|true|true|true|3|1")
    assert _render(sglang, "{{ tools|length }}", tools=[]) == Rendered("0")
    assert isinstance(_render(sglang, "x", add_generation_prompt=False), Skipped)
    assert isinstance(_render(sglang, "x", documents=[{"title": "t", "text": "x"}]), Skipped)


def test_maps_are_sorted_and_messages_are_the_request_structs(sglang):
    assert _render(sglang, "{{ messages[0] }}", [{"role": "user", "content": "hi", "name": "b", "x": 1}]) == \
        Rendered('{"content": "hi", "name": "b", "role": "user"}')
    assert _render(sglang, "{{ tools|tojson }}", tools=[TOOL]) == Rendered(
        '[{"function":{"name":"f","parameters":{"a":2,"b":1.0,"type":"object"}},"type":"function"}]')
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "content": "r", "tool_call_id": "1", "name": "f"}]
    assert _render(sglang, "{{ messages[1] }}|{{ messages[2] }}", history) == Rendered(
        '{"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": 2, "b": 1}, "name": "f"}, '
        '"id": "1", "type": "function"}]}|{"content": "r", "role": "tool", "tool_call_id": "1"}')


def test_requests_the_gateway_refuses(sglang):
    prefix = "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
    assert _render(sglang, "x", [{"role": "robot", "content": "x"}]) == Raised(
        prefix + "messages[0]: unknown variant `robot`, expected one of `system`, `user`, `assistant`, `tool`, "
        "`function`, `developer`", RefusalKind.RENDER)
    assert _render(sglang, "x", [{"role": "tool", "content": "x"}]) == \
        Raised(prefix + "messages[0]: missing field `tool_call_id`", RefusalKind.RENDER)
    assert _render(sglang, "x", USER, tools=[{"type": "function", "function": {"name": "f"}}]) == \
        Raised(prefix + "tools[0].function: missing field `parameters`", RefusalKind.RENDER)
    object_args = {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert isinstance(_render(sglang, "x", USER + [{"role": "assistant", "tool_calls": [object_args]}]), Raised)
    bad_args = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    assert _render(sglang, "x", USER + [{"role": "assistant", "tool_calls": [bad_args]}]) == \
        Raised("Failed to parse tool call arguments as JSON: '{not json'", RefusalKind.RENDER)
    assert _render(sglang, "x", [{"role": "user", "content": ""}]) == \
        Raised("messages: Validation error: message content cannot be empty", RefusalKind.RENDER)


def test_content_format_decides_what_a_list_content_becomes(sglang):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url",
                                                                       "image_url": {"url": "u"}},
                                          {"type": "text", "text": "b"}]}]
    # "string" format: the text parts joined with a space
    assert _render(sglang, "{{ messages[0].content }}", parts) == Rendered("a b")
    # "openai" format (the template iterates the content): parts kept, media as a bare type
    walk = "{% for m in messages %}{% for p in m.content %}{{ p }};{% endfor %}{% endfor %}"
    assert _render(sglang, walk, parts) == \
        Rendered('{"text": "a", "type": "text"};{"type": "image"};{"text": "b", "type": "text"};')


def test_content_format_detector_walks_the_ast_as_the_gateway_does():
    from runners.sglang_runner import openai_content_format as openai

    assert not openai("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert openai("{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}")
    assert openai("{% for m in messages %}{% if m['content'] is string %}{% endif %}{% endfor %}")
    assert openai("{% for m in messages %}{{ m.content[0].text }}{% endfor %}")
    assert openai("{% for m in messages %}{% set content = m.content %}{% endfor %}")
    assert openai("{% for m in messages %}{% if a %}{% elif m.content|length %}{% endif %}{% endfor %}")
    assert openai("{% macro r(c) %}{% if c is string %}{{ c }}{% else %}{% for x in c %}{% endfor %}{% endif %}"
                  "{% endmacro %}")
    # outside a loop over `messages`, `message.content` is no scope variable's content
    assert not openai("{{ message.content is string }}")
    assert not openai("{% for m in messages %}{% for p in m.content %}")  # does not parse: "string"


def test_continue_final_message_pops_the_assistant_turn_and_appends_it(sglang):
    messages = USER + [{"role": "assistant", "content": "part"}]
    assert _render(sglang, "{% for m in messages %}[{{ m.content }}]{% endfor %}{{ add_generation_prompt }}",
                   messages, add_generation_prompt=False, continue_final_message=True) == \
        Rendered("[hi]truepart")
