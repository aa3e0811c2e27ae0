"""Shared inputs for the evaluator tests and benchmark (no tests here): the real templates and varied chats."""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def real_templates() -> dict:
    """{name: source} of the real corpus: templates/ (manifest) when imported, else the llama.cpp cache."""
    manifest = REPO / "templates" / "manifest.json"
    if manifest.exists():
        data = json.loads(manifest.read_text(encoding="utf-8"))
        return {entry["id"]: (REPO / "templates" / entry["file"]).read_text(encoding="utf-8")
                for entry in data["templates"]}
    pattern = os.path.expanduser("~/.cache/chatgold/dl/src/*/llama.cpp/models/templates/*.jinja")
    found = {}
    for path in sorted(glob.glob(pattern)):
        found.setdefault(Path(path).stem, Path(path).read_text(encoding="utf-8"))
    return found


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris", "unit": "c"}}}

CONVERSATIONS = {
    "single-user": dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True),
    "system-multiturn": dict(messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True),
    "no-generation-prompt": dict(messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]),
    "tools-call": dict(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks"}], tools=[WEATHER_TOOL], add_generation_prompt=True),
    "tools-string-args": dict(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "cold"}], tools=[WEATHER_TOOL]),
    "reasoning": dict(messages=[
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "Answer: 4", "reasoning_content": "2+2 is 4."},
        {"role": "user", "content": "Again"}], add_generation_prompt=True),
    "unicode": dict(messages=[
        {"role": "system", "content": "Réponds en français 🌍"},
        {"role": "user", "content": "日本語のテキスト — \"quotes\" and \\backslash\n\tnewline"}],
        add_generation_prompt=True),
    "continue-final": dict(messages=[
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moonlight  "}], continue_final_message=True),
    "thinking-off": dict(messages=[{"role": "user", "content": "Quick answer"}], add_generation_prompt=True,
                         kwargs={"enable_thinking": False}),
    "thinking-on": dict(messages=[{"role": "user", "content": "Slow answer"}], add_generation_prompt=True,
                        kwargs={"enable_thinking": True, "reasoning_effort": "high"}),
    "documents": dict(messages=[{"role": "user", "content": "Summarize"}], add_generation_prompt=True,
                      documents=[{"title": "Doc A", "text": "Alpha text."}, {"title": "Doc B", "text": "Beta."}]),
    "content-blocks": dict(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": "briefly"}]}],
        add_generation_prompt=True),
    "assistant-last-thinking": dict(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "thinking": "hmm"}]),
    "tokens": dict(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                   add_generation_prompt=True, bos_token="<s>", eos_token="</s>"),
    "tokens-im": dict(messages=[{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}],
                      bos_token="<|begin_of_text|>", eos_token="<|im_end|>"),
    "only-system": dict(messages=[{"role": "system", "content": "Just a system prompt"}]),
}
