"""llama.cpp's own autoparser analysis of a template, read from llama-server's start-up log.

llama-server b11434 runs its differential template analysis once at start-up (the enable_thinking probe,
tools/server/server-context.cpp -> common_chat_templates_support_enable_thinking) and prints the result with
LOG_DBG in `autoparser::analyze_template` (common/chat-diff-analyzer.cpp), one `key: value` record per field,
between `--- Reasoning & Content Structure ---` and `parameter_order`. At `-lv 5 --log-jsonl` every record is
one JSON object on stdout, so values with newlines stay whole. Specialized templates (GPT-OSS, Functionary
v3.2, ...) are not analysed: the log says `Using specialized template: <name>` instead.

The log names are llama.cpp's (user_msg_start, tool_mode, func_name_prefix, ...); string values are printed
inside single quotes except user_msg_start/assistant_msg_start. Not logged at all, so never known from here:
content.requires_nonnull_content, format.function_field, fun_name_is_key, tools_array_wrapped,
openai_wrapper_trigger, arguments.separator, tolerate_intertag_whitespace, preserved_tokens, additional_stops.
"""
from __future__ import annotations

import json
import re
from typing import Optional

BLOCK_START = "--- Reasoning & Content Structure ---"
LAST_FIELD = "parameter_order"
SPECIALIZED = "Using specialized template:"
PATCH = re.compile(r"\[Patch: ([^\]]*)\]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOT_LOGGED = ("requires_nonnull_content", "function_field", "fun_name_is_key", "tools_array_wrapped",
              "arguments_separator", "preserved_tokens")


def _messages(log: bytes) -> list[str]:
    """The `msg` of every JSON log record, in order (lines that are not JSON records are skipped)."""
    out = []
    for line in log.decode("utf-8", "replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("msg"), str):
            out.append(ANSI.sub("", record["msg"]))
    return out


def _value(raw: str) -> str:
    """A logged value without the record's newline and the quotes llama.cpp puts around most values."""
    if raw.endswith("\n"):
        raw = raw[:-1]
    if len(raw) >= 2 and raw.startswith("'") and raw.endswith("'"):
        raw = raw[1:-1]
    return raw


def parse_analysis_log(log: bytes) -> dict:
    """{"fields": {log name: value} of the first analysis block (None when there is none), "specialized":
    the specialized template's name or None, "workarounds": the `[Patch: ...]` notes before the block}."""
    fields: Optional[dict] = None
    specialized, patches = None, []
    inside = False
    for message in _messages(log):
        text = message.strip()
        if fields is None and not inside:
            if SPECIALIZED in text and specialized is None:
                specialized = text.split(SPECIALIZED, 1)[1].strip()
            patches.extend(PATCH.findall(text))
            if text == BLOCK_START:
                inside, fields = True, {}
            continue
        if not inside:
            break
        if text.startswith("---") or text.startswith("==="):
            continue
        key, sep, raw = message.lstrip("\n").partition(": ")
        if not sep or not re.fullmatch(r"[a-z_]+", key):
            continue
        fields[key] = _value(raw)
        if key == LAST_FIELD:
            inside = False
            break
    return {"fields": fields, "specialized": specialized, "workarounds": patches}
