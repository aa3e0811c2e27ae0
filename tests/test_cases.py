"""The conversation cases: valid, consistently tagged, covering what the spine promises, and loadable only when sane."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from conformance.corpus.cases import CASES_DIR, Case, CaseError, load_case, load_cases
from runners.base import DEFAULT_NOW

FEATURES_PATH = CASES_DIR.parent / "features.json"


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases()


@pytest.fixture(scope="module")
def vocabulary() -> dict:
    return json.loads(FEATURES_PATH.read_text(encoding="utf-8"))


def _messages(case: Case):
    return case.conversation.messages


def _tool_calls(case: Case):
    for message in case.conversation.messages:
        for tool_call in message.get("tool_calls") or []:
            yield tool_call


# --- files, ids, vocabulary --------------------------------------------------------------------------------

def test_every_case_file_loads_and_there_are_enough(cases):
    files = sorted(CASES_DIR.glob("*.json"))
    assert len(cases) == len(files)
    assert len(cases) >= 60


def test_ids_are_unique_and_equal_file_names(cases):
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids))
    for case in cases:
        assert Path(case.path).name == case.id + ".json"


def test_vocabulary_is_one_line_meanings(vocabulary):
    assert vocabulary
    for tag, meaning in vocabulary.items():
        assert isinstance(meaning, str) and meaning.strip() and "\n" not in meaning, tag


def test_every_tag_is_in_the_vocabulary_and_every_entry_is_used(cases, vocabulary):
    used = set()
    for case in cases:
        unknown = set(case.features) - set(vocabulary)
        assert not unknown, f"{case.id}: tags not in conformance/features.json: {sorted(unknown)}"
        used |= set(case.features)
    assert not set(vocabulary) - used, f"vocabulary entries no case uses: {sorted(set(vocabulary) - used)}"


# --- tags that can be checked against the data --------------------------------------------------------------

def _facts(case: Case) -> dict:
    """Tags whose truth follows from the case data alone."""
    contents = [m.get("content", "<missing>") for m in case.conversation.messages]
    arguments = [tc.get("function", {}).get("arguments") for tc in _tool_calls(case)]
    roles_with_parts = {m["role"] for m in case.conversation.messages if isinstance(m.get("content"), list)}
    facts = {
        "tools": case.conversation.tools is not None,
        "tools.empty-list": case.conversation.tools == [],
        "tool-calls": any(True for _ in _tool_calls(case)),
        "tool-calls.parallel": any(len(m.get("tool_calls") or []) > 1 for m in case.conversation.messages),
        "arguments.object": any(isinstance(a, dict) for a in arguments),
        "arguments.string": any(isinstance(a, str) for a in arguments),
        "tool-result": any(m["role"] == "tool" for m in case.conversation.messages),
        "null-content": any(c is None for c in contents),
        "empty-content": any(c == "" for c in contents),
        "reasoning-content": any("reasoning_content" in m for m in case.conversation.messages),
        "developer-role": any(m["role"] == "developer" for m in case.conversation.messages),
        "documents": case.conversation.documents is not None,
        "continue-final-message": case.conversation.continue_final_message,
        "sequence": case.sequence is not None,
        "kwargs": bool(case.conversation.kwargs),
        "clock": case.conversation.now != DEFAULT_NOW,
        "ends-with-assistant": bool(case.conversation.messages) and case.conversation.messages[-1]["role"] == "assistant",
        "content-parts": bool(roles_with_parts),
        "tools.dropped": case.conversation.tools is None and any(True for _ in _tool_calls(case)),
        "thinking.on": case.conversation.kwargs.get("enable_thinking") is True,
        "thinking.off": case.conversation.kwargs.get("enable_thinking") is False,
    }
    for role in ("system", "user", "assistant", "tool"):
        facts[f"content-parts.{role}"] = role in roles_with_parts
    return facts


def test_checkable_tags_match_the_data(cases, vocabulary):
    for case in cases:
        for tag, true in _facts(case).items():
            assert tag in vocabulary, tag
            assert (tag in case.features) == true, f"{case.id}: tag {tag!r} {'missing' if true else 'wrong'}"
        kwarg_tags = {t.split(".", 1)[1] for t in case.features if t.startswith("kwarg.")}
        assert kwarg_tags == set(case.conversation.kwargs), f"{case.id}: kwarg.* tags {kwarg_tags} vs kwargs {set(case.conversation.kwargs)}"


# --- the coverage the spine lists ---------------------------------------------------------------------------

REQUIRED_FEATURES = [
    "chat", "system", "multi-turn", "whitespace", "no-generation-prompt", "continue-final-message",
    "unicode.cjk", "unicode.emoji", "unicode.rtl", "unicode.combining", "special-chars", "template-syntax-text",
    "empty-content", "null-content", "content-parts", "image", "tools", "tools.multiple", "tools.nested-schema",
    "tools.unsorted-keys", "tools.scalars", "arguments.object", "arguments.string", "tool-calls.parallel",
    "tool-result", "multi-round-tools", "reasoning-content", "reasoning-only", "think-in-content",
    "thinking.on", "thinking.off", "thinking.absent", "developer-role", "non-alternating", "documents",
    "kwarg.tools_in_user_message", "kwarg.date_string", "kwarg.builtin_tools", "kwarg.custom_tools",
    "kwarg.reasoning_effort", "kwarg.thinking", "kwarg.enable_thinking", "long-history", "clock.year-end",
    "clock.leap-day", "tools.dropped", "content-parts.system", "content-parts.user", "content-parts.assistant",
    "content-parts.tool", "wire-format", "sequence",
]


def test_required_features_are_covered(cases):
    present = {tag for case in cases for tag in case.features}
    missing = [tag for tag in REQUIRED_FEATURES if tag not in present]
    assert not missing, f"no case covers: {missing}"


def test_coverage_in_the_data_itself(cases):
    """The same promises checked on the messages, not on the tags."""
    def some(predicate):
        return any(predicate(case) for case in cases)

    assert some(lambda c: any(m["role"] == "assistant" and m.get("content") is None and m.get("tool_calls")
                              for m in c.conversation.messages))
    assert some(lambda c: any(m["role"] == "assistant" and m.get("reasoning_content") and m.get("content") in ("", None)
                              for m in c.conversation.messages))
    assert some(lambda c: any(isinstance(m.get("content"), str) and "<think>" in m["content"]
                              for m in c.conversation.messages if m["role"] == "assistant"))
    assert some(lambda c: any(isinstance(m.get("content"), list)
                              and any(p.get("type") in ("image", "image_url") for p in m["content"])
                              for m in c.conversation.messages))
    assert some(lambda c: all(m.get("tool_call_id") and m.get("name") for m in c.conversation.messages if m["role"] == "tool")
                and any(m["role"] == "tool" for m in c.conversation.messages))
    assert some(lambda c: "enable_thinking" not in c.conversation.kwargs and "thinking.absent" in c.features)
    assert some(lambda c: len(c.conversation.messages) >= 100)
    assert some(lambda c: sum(m["role"] == "user" for m in c.conversation.messages) >= 50)
    assert some(lambda c: "-12-31T23:59:59" in c.conversation.now)
    assert some(lambda c: "-02-29T" in c.conversation.now)
    assert some(lambda c: any(m.get("content") and all(
        ch in m["content"] for ch in "<>&'\"/\\") for m in c.conversation.messages if isinstance(m.get("content"), str)))
    assert some(lambda c: any(isinstance(m.get("content"), str) and "{{" in m["content"] and "{%" in m["content"]
                              for m in c.conversation.messages))
    for name in ("reasoning_effort", "enable_thinking", "thinking", "custom_tools", "tools_in_user_message",
                 "date_string", "builtin_tools"):
        assert some(lambda c: name in c.conversation.kwargs), name
    for value in (True, False):
        assert some(lambda c: c.conversation.kwargs.get("enable_thinking") is value)


def test_tool_shapes_follow_the_openai_format(cases):
    for case in cases:
        for tool in case.conversation.tools or []:
            assert tool.get("type") == "function", case.id
            function = tool["function"]
            assert function["name"] and isinstance(function.get("description"), str), case.id
            assert function["parameters"]["type"] == "object", case.id
        seen_ids = set()
        for message in case.conversation.messages:
            for tool_call in message.get("tool_calls") or []:
                assert tool_call["type"] == "function" and tool_call["id"], case.id
                assert tool_call["function"]["name"], case.id
                arguments = tool_call["function"]["arguments"]
                if isinstance(arguments, str):
                    assert isinstance(json.loads(arguments), dict), f"{case.id}: arguments string is not a JSON object"
                else:
                    assert isinstance(arguments, dict), case.id
                seen_ids.add(tool_call["id"])
            if message["role"] == "tool":
                assert message.get("tool_call_id") in seen_ids, f"{case.id}: tool result answers no earlier call"


def test_generation_prompt_conventions(cases):
    for case in cases:
        last = case.conversation.messages[-1]["role"]
        if case.conversation.continue_final_message:
            assert last == "assistant" and not case.conversation.add_generation_prompt, case.id
        elif "no-generation-prompt" in case.features:
            assert last in ("user", "tool") and not case.conversation.add_generation_prompt, case.id
        elif "generation-prompt-after-assistant" in case.features:
            assert last == "assistant" and case.conversation.add_generation_prompt, case.id
        elif "system-only" in case.features:
            assert case.conversation.add_generation_prompt, case.id
        else:
            assert case.conversation.add_generation_prompt == (last in ("user", "tool")), case.id


# --- sequences ------------------------------------------------------------------------------------------------

def test_sequences_are_true_prefixes(cases):
    by_name = defaultdict(dict)
    for case in cases:
        if case.sequence:
            step = case.sequence["step"]
            assert step not in by_name[case.sequence["name"]], f"{case.id}: step {step} twice"
            by_name[case.sequence["name"]][step] = case
            assert case.id == f"seq-{case.sequence['name']}-{step}", case.id
    assert len(by_name) >= 2
    assert any(any(c.conversation.tools for c in steps.values()) for steps in by_name.values()), "no tool-use sequence"
    for name, steps in by_name.items():
        assert sorted(steps) == list(range(1, len(steps) + 1)) and len(steps) >= 4, name
        for n in range(1, len(steps)):
            shorter, longer = steps[n], steps[n + 1]
            shorter, longer = shorter.conversation, longer.conversation
            assert len(longer.messages) > len(shorter.messages), (name, n)
            assert longer.messages[:len(shorter.messages)] == shorter.messages, f"{name}: step {n} is not a prefix of {n + 1}"
            for attribute in ("tools", "documents", "kwargs", "now", "add_generation_prompt", "continue_final_message"):
                assert getattr(longer, attribute) == getattr(shorter, attribute), (name, n, attribute)


# --- every case renders through the reference ---------------------------------------------------------------

# A tolerant ChatML-style template: it accepts every shape the cases use, so a refusal here means the input
# itself is malformed for transformers (not that some model's template is strict).
TOLERANT_TEMPLATE = """
{%- macro text(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- else -%}<{{ part.type }}>{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools is not none -%}<tools>{{ tools | tojson }}</tools>{%- endif -%}
{%- if documents is not none -%}<docs>{{ documents | tojson }}</docs>{%- endif -%}
{%- for m in messages -%}
<|{{ m.role }}|>{% if m.reasoning_content is defined %}<r>{{ m.reasoning_content }}</r>{% endif %}{{ text(m.content) }}
{%- for tc in m.tool_calls or [] -%}<call id={{ tc.id }}>{{ tc.function.name }} {{ tc.function.arguments | tojson }}</call>{%- endfor -%}
<|end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}
"""


def test_every_case_renders_through_the_reference(cases):
    from runners.hf import HFRenderer

    renderer = HFRenderer()
    for case in cases:
        outcome = renderer.render(case.request(TOLERANT_TEMPLATE, "<s>", "</s>", "tolerant"))
        assert outcome.kind == "rendered", f"{case.id}: {outcome}"
        for message in case.conversation.messages:
            content = message.get("content")
            if isinstance(content, str) and content.strip() and not case.conversation.continue_final_message:
                assert content in outcome.text, f"{case.id}: content missing from the rendered prompt"


# --- invalid case files name the file and the problem ---------------------------------------------------------

VALID = {"id": "x", "description": "d", "features": ["chat"], "messages": [{"role": "user", "content": "hi"}]}


def _write(directory: Path, name: str, data) -> Path:
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("name, data, problem", [
    ("x.json", '{"id": "x", "description": ', "invalid JSON at line 1"),
    ("x.json", {k: v for k, v in VALID.items() if k != "messages"}, "'messages' is a required property"),
    ("x.json", {k: v for k, v in VALID.items() if k != "description"}, "'description' is a required property"),
    ("y.json", VALID, "does not match the file name 'y'"),
    ("x.json", dict(VALID, kwargs={"messages": []}), "kwargs"),
    ("x.json", dict(VALID, kwargs={"add_generation_prompt": True}), "kwargs"),
    ("x.json", dict(VALID, features=[]), "features"),
    ("x.json", dict(VALID, now="31/12/2024 23:59"), "now"),
    ("x.json", dict(VALID, sequence={"name": "s", "step": 0}), "sequence"),
    ("x.json", dict(VALID, surprise=1), "surprise"),
])
def test_invalid_case_files_raise_case_error_naming_file_and_problem(tmp_path, name, data, problem):
    path = _write(tmp_path, name, data)
    with pytest.raises(CaseError) as info:
        load_case(path)
    message = str(info.value)
    assert str(path) in message
    assert problem in message


def test_non_utf8_case_file_is_a_case_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'{"id": "x", "description": "\xff"}')
    with pytest.raises(CaseError, match="not UTF-8"):
        load_case(path)


def test_load_cases_reports_the_bad_file_among_good_ones(tmp_path):
    _write(tmp_path, "x.json", VALID)
    _write(tmp_path, "z.json", dict(VALID, id="z", messages="not a list"))
    with pytest.raises(CaseError) as info:
        load_cases(tmp_path)
    assert "z.json" in str(info.value) and "messages" in str(info.value)
