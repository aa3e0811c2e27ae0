"""`chatgold render` on templates and cases it has never seen, against transformers used directly."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}"
    "{%- if m.tool_calls is defined %}{{ m.tool_calls | tojson(indent=1) }}{% endif %}{{ eos_token }}\n"
    "{%- endfor %}{%- if tools %}[{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
    "{{ strftime_now('%A %d %B %Y') }}{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
CASE = {
    "id": "unseen", "description": "never seen", "features": ["chat"],
    "messages": [{"role": "user", "content": "  héllo 世界 \u202e  "},
                 {"role": "assistant", "content": None,
                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1.5, "a": None}}}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": True, "now": "2024-02-29T23:59:59Z",
}


def _chatgold(*args, **kw):
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], capture_output=True, **kw)


def _direct_transformers(template: str, case: dict, bos: str, eos: str) -> str:
    import datetime
    from unittest import mock

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import chat_template_utils

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({bos: 0, eos: 1}, unk_token=None)),
                                  bos_token=bos, eos_token=eos)

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2024, 2, 29, 23, 59, 59)

    with mock.patch.object(chat_template_utils, "datetime", Frozen):
        return tok.apply_chat_template(case["messages"], tools=case["tools"], chat_template=template,
                                       add_generation_prompt=True, tokenize=False)


def test_render_matches_transformers_byte_for_byte(tmp_path):
    template = tmp_path / "unseen.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    case = tmp_path / "case.json"
    case.write_text(json.dumps(CASE), encoding="utf-8")
    proc = _chatgold("render", "--runner", "hf", "--template-file", str(template), "--bos", "<B>", "--eos", "</E>",
                     "--case-file", str(case))
    assert proc.returncode == 0, proc.stderr.decode()
    expected = _direct_transformers(TEMPLATE, CASE, "<B>", "</E>")
    assert proc.stdout == expected.encode("utf-8")
    assert b"Thursday 29 February 2024" in proc.stdout


def test_raised_exits_3_with_message_and_runner_failure_exits_4(tmp_path):
    template = tmp_path / "refuse.jinja"
    template.write_text("{{ raise_exception('System role not supported') }}")
    proc = _chatgold("render", "--template-file", str(template), "--case", "chat-system")
    assert proc.returncode == 3 and proc.stdout == b""
    assert b"System role not supported" in proc.stderr
    proc = _chatgold("render", "--runner", "command:false", "--template-file", str(template), "--case", "chat-system")
    assert proc.returncode == 4 and proc.stdout == b""


@pytest.mark.parametrize("bad, message", [
    ("{not json", "invalid JSON at line 1"),
    (json.dumps({"id": "x", "description": "d", "features": ["chat"]}), "'messages' is a required property"),
    (json.dumps({"id": "x", "description": "d", "features": ["chat"], "messages": [], "kwargs": {"tools": []}}),
     "invalid case at kwargs"),
])
def test_invalid_case_file_is_a_clear_error(tmp_path, bad, message):
    case = tmp_path / "bad-case.json"
    case.write_text(bad)
    proc = _chatgold("render", "--template", "qwen-qwen2.5-7b-instruct", "--case-file", str(case), text=True)
    assert proc.returncode == 2
    assert "bad-case.json" in proc.stderr and message in proc.stderr


def test_a_minimal_case_file_needs_only_messages(tmp_path):
    """`render --case-file` takes a bare conversation: messages, plus what it needs; a naive `now` is UTC."""
    template = tmp_path / "t.jinja"
    template.write_text("{{ strftime_now('%d %B %Y %H:%M') }}|{{ tools }}|{{ messages[0].content }}|"
                        "{{ enable_thinking }}")
    case = tmp_path / "mine.json"
    case.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "now": "2024-02-29T23:59:00",
                                "kwargs": {"enable_thinking": False}}))
    proc = _chatgold("render", "--template-file", str(template), "--case-file", str(case))
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b"29 February 2024 23:59|None|hi|False"
    case.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "now": "not a date"}))
    proc = _chatgold("render", "--template-file", str(template), "--case-file", str(case), text=True)
    assert proc.returncode == 2 and "mine.json" in proc.stderr and "not a date" in proc.stderr
    help_text = _chatgold("render", "--help", text=True).stdout
    assert "only `messages` is required" in " ".join(help_text.split())


def test_template_and_case_globs_match_case_insensitively():
    from conformance.judge.pipeline import Selection

    selection = Selection.load(templates=["Unsloth-Qwen3-8B"], cases=["CHAT-SYS*"])
    assert [t.id for t in selection.templates] == ["unsloth-qwen3-8b"]
    assert {c.id for c in selection.cases} == {"chat-system"}
