"""The mistralrs runner (a reproduction on the minijinja binding) against the real mistralrs wheel.

The wheel cannot return its prompt, only say whether it equals a text (runners/mistralrs_oracle.py), so every
comparable cell of a fixed sample is rendered by the reproduction and put to the wheel. The few cells where
they differ are listed here: a new disagreement, or a listed one that goes away, fails the test."""
from __future__ import annotations

import pytest

SAMPLE = ["qwen-qwen2.5-7b-instruct", "mistralai-mistral-7b-instruct-v0.3", "minimaxai-minimax-m2.7",
          "unsloth-gemma-4-thinking", "codellama-codellama-70b-instruct-hf", "trl-cohere_training"]
# Known differences from mistralrs 0.9.5, not reproduced: its Gemma 4 tool-turn handling (docs/engines.md).
KNOWN = {("unsloth-gemma-4-thinking", "tool-call-args-string"),
         ("unsloth-gemma-4-thinking", "tool-calls-parallel-string-args"),
         ("unsloth-gemma-4-thinking", "tools-no-parameters"), ("unsloth-gemma-4-thinking", "wire-empty-strings")}


def test_reproduction_agrees_with_the_mistralrs_wheel():
    from conformance.judge.pipeline import Selection
    from runners import get_runner
    from runners.mistralrs_oracle import REQUIREMENTS, WHEEL_VERSION, verify
    from runners.versions import installed_venv

    if installed_venv(f"mistralrs-{WHEEL_VERSION}", REQUIREMENTS) is None:
        pytest.fail("the mistralrs wheel is not installed in the cache: run scripts/setup.sh (tests never download)")
    cells = Selection.load(SAMPLE).cells()
    requests = [c.request for c in cells]
    with get_runner("mistralrs") as runner:
        outcomes = list(runner.render_many(requests))
    result = verify(requests, outcomes)
    found = {(d["template"], d["case"]) for d in result["disagreements"]}
    assert found == KNOWN, result["disagreements"]
    assert result["counts"]["agree"] >= 200, result["counts"]


USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# Request shapes a reducer reaches by dropping keys or items, and a few a client may send: each is rendered by the
# reproduction and put to the wheel (a refusal must be the wheel's, with its message; a text its exact prompt).
SHAPES = {
    "tool {}": ([USER], [{}], "refused"),
    "tool without type": ([USER], [{"function": TOOL["function"]}], "refused"),
    "tool of another type": ([USER], [{"type": "fn", "function": TOOL["function"]}], "refused"),
    "tool type null": ([USER], [{"type": None, "function": TOOL["function"]}], "refused"),
    "function without name": ([USER], [{"type": "function", "function": {"parameters": {}}}], "refused"),
    "parameters not a map": ([USER], [{"type": "function", "function": {"name": "f", "parameters": "x"}}], "refused"),
    "tool not an object": ([USER], ["f"], "refused"),
    "arguments alias": ([USER], [{"type": "function", "function": {"name": "f", "arguments": {"type": "object"}}}],
                        "rendered"),
    "message without content": ([{"role": "user"}], None, "refused"),
    "message without role": ([{"content": "hi"}], None, "refused"),
    "one part of another type": ([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], None,
                                 "rendered"),
    "one part without text": ([{"role": "user", "content": [{"type": "text"}]}], None, "refused"),
    "a text part without text": ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}],
                                 None, "refused"),
    "several parts, not a user": ([USER, {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                                            {"type": "text", "text": "b"}]}],
                                  None, "refused"),
}


def test_request_shapes_are_refused_or_rendered_as_the_wheel_does():
    from runners import RenderRequest, get_runner
    from runners.base import Raised, Rendered
    from runners.mistralrs_oracle import REQUIREMENTS, WHEEL_VERSION, Oracle
    from runners.versions import installed_venv

    if installed_venv(f"mistralrs-{WHEEL_VERSION}", REQUIREMENTS) is None:
        pytest.fail("the mistralrs wheel is not installed in the cache: run scripts/setup.sh (tests never download)")
    template = "{{ messages[-1].content }}|{% if tools %}{{ tools[0].function.parameters }}{% endif %}"
    disagreements = {}
    with get_runner("mistralrs") as runner, Oracle() as oracle:
        for name, (messages, tools, kind) in SHAPES.items():
            request = RenderRequest.make(template, messages, "<s>", "</s>", tools=tools, add_generation_prompt=True)
            outcome = runner.render(request)
            assert isinstance(outcome, Raised if kind == "refused" else Rendered), (name, outcome)
            agrees, answer = oracle.check(request, outcome)
            if not agrees:
                disagreements[name] = (outcome, answer)
    assert not disagreements, disagreements


REASONING = "{{ reasoning_effort }}|{{ reasoning_strength }}|{{ enable_thinking }}"
# mistral.rs's own checks and bindings (tojson's indent cap, the two reasoning controls), each pinned and put to
# the wheel: (template, kwargs, the reproduction's outcome).
CONTROLS = {
    "indent over 256": ("{{ messages|tojson(indent=300) }}", {},
                        "invalid operation: tojson `indent` of 300 exceeds the maximum of 256"),
    "indent 256": ("{{ {'a': 1}|tojson(indent=256)|length }}", {}, "266"),
    "effort high": (REASONING, {"reasoning_effort": "high"}, "high|high|true"),
    "no effort": (REASONING + "|{{ reasoning_strength is defined }}", {}, "||true|false"),
    "effort off": (REASONING, {"reasoning_effort": "off"}, "off|off|false"),
    "effort spelled max": (REASONING, {"reasoning_effort": " MAX "}, "xhigh|xhigh|true"),
    "effort none, thinking off": (REASONING, {"reasoning_effort": "none", "enable_thinking": False}, "off|off|false"),
    "effort high, thinking off": (REASONING, {"reasoning_effort": "high", "enable_thinking": False},
                                  "reasoning effort `high` conflicts with enable_thinking=false"),
    "effort off, thinking on": (REASONING, {"reasoning_effort": "off", "enable_thinking": True},
                                "reasoning effort `off` conflicts with enable_thinking=true"),
    "unknown effort": (REASONING, {"reasoning_effort": "extreme"},
                       "invalid reasoning effort `extreme`; expected one of: off, none, low, medium, high, xhigh, max"),
}


def test_reasoning_controls_and_tojson_indent_are_the_wheels():
    from runners import RenderRequest, get_runner
    from runners.base import Raised, Rendered
    from runners.mistralrs_oracle import REQUIREMENTS, WHEEL_VERSION, Oracle
    from runners.versions import installed_venv

    if installed_venv(f"mistralrs-{WHEEL_VERSION}", REQUIREMENTS) is None:
        pytest.fail("the mistralrs wheel is not installed in the cache: run scripts/setup.sh (tests never download)")
    disagreements = {}
    with get_runner("mistralrs") as runner, Oracle() as oracle:
        for name, (template, kwargs, expected) in CONTROLS.items():
            request = RenderRequest.make(template, [USER], "<s>", "</s>", add_generation_prompt=True, kwargs=kwargs)
            outcome = runner.render(request)
            if isinstance(outcome, Raised):
                assert outcome.message == expected, (name, outcome)
            else:
                assert outcome == Rendered(expected), (name, outcome)
            agrees, answer = oracle.check(request, outcome)
            if not agrees:
                disagreements[name] = (outcome, answer)
    assert not disagreements, disagreements


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}


def test_server_route_passes_tool_calls_tool_call_id_and_name_and_parses_arguments():
    """mistralrs-server reads messages as the HTTP server does (mistralrs-server-core chat_completion.rs):
    unlike the Python API (role and content only, object-valued messages refused), tool calls, tool_call_id and
    name reach the template and `arguments` is parsed into a mapping."""
    from runners import RenderRequest, get_runner
    from runners.base import Raised, RefusalKind, Rendered

    history = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "content": "r", "tool_call_id": "c1", "name": "f"}]

    def render(runner, template, messages, **kwargs):
        return runner.render(RenderRequest.make(template, messages, "<s>", "</s>", add_generation_prompt=True,
                                                kwargs=kwargs))

    with get_runner("mistralrs-server") as server, get_runner("mistralrs") as api:
        assert render(server, "{{ messages[1] }}|{{ messages[2] }}", history) == Rendered(
            '{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": '
            '{"name": "f", "arguments": {"b": 1, "a": 2}}}]}|{"role": "tool", "content": "r", "tool_call_id": '
            '"c1", "name": "f"}')
        assert isinstance(render(api, "{{ messages[1] }}", history), Raised)
        # a call without an id gets its function's name; arguments that are not a JSON object stay text
        bare = {"type": "function", "function": {"name": "g", "arguments": "[1]"}}
        assert render(server, "{{ messages[1].tool_calls[0].id }}|{{ messages[1].tool_calls[0].function.arguments }}",
                      [USER, {"role": "assistant", "content": "", "tool_calls": [bare]}]) == Rendered("g|[1]")
        assert render(server, "x", [USER, {"role": "assistant", "content": None}]) == \
            Raised("No content was provided, expected tool calls to be provided.", RefusalKind.RENDER)
        objects = {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
        assert render(server, "x", [USER, {"role": "assistant", "content": None, "tool_calls": [objects]}]) == \
            Raised("Failed to deserialize the JSON body into the target type: messages: data did not match any "
                   "variant of untagged enum Either", RefusalKind.RENDER)
        # chat_template_kwargs: only the reasoning controls are read; another kwarg is dropped, not refused
        assert render(server, "{{ foo }}|{{ enable_thinking }}|{{ reasoning_strength }}", [USER], foo=1,
                      reasoning_effort="low") == Rendered("|true|low")
