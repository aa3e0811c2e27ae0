"""Example harness: paperkiln's record-based renderer (seed 003, chat_template.hpp as vendored by ember.cpp).

paperkiln never evaluates Jinja. It resolves a *record* (bos; per-role open/close; the system message folded
into the first user message or rendered as its own turn; a generation prompt) and renders from it:
bos, then each message as open + content + close, then the generation prompt when a reply is wanted.

Resolution as its resolve() does it, from what a harness can see: (1) a declared record -- this harness's
`--declared <record id>` stands for a GGUF's paperkiln.chat_template key; (4) a third-party record whose
`match` holds the sha256 of the exact template text. Vocabulary and architecture are not part of a render
request, so steps (2), (3) and the markers rule cannot fire; an unresolved template is Skipped with
paperkiln's own reason ("raw completion only").
"""
import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Raised, RefusalKind, Rendered, Skipped  # noqa: E402
from runners.harness import serve  # noqa: E402
from runners.identity import harness_build  # noqa: E402


class PaperkilnError(Exception):
    pass


def record(name, version, **fields):
    base = {"name": name, "version": version, "bos": "", "content": "raw", "system_mode": "none", "system_join": "",
            "system_open": "", "system_close": "", "user_open": "", "user_close": "", "assistant_open": "",
            "assistant_close": "", "generation_prompt": "", "generation_prompt_nothink": None,
            "past_assistant": "keep", "default_system": None, "reserved": [], "match": [],
            "tool": None, "tools": None}
    base.update(fields)
    return base


V1 = record("paperkiln", 1, system_mode="fold", system_join="\n\n", user_open="<|user|>",
            assistant_open="<|assistant|>", assistant_close="<|endoftext|>", generation_prompt="<|assistant|>",
            reserved=["<|endoftext|>", "<|user|>", "<|assistant|>"])
V2_CONTROL = ["<|system|>", "<|tool_call|>", "<|tool|>", "<|spare_3|>", "<|spare_4|>", "<|spare_5|>",
              "<|spare_6|>", "<|spare_7|>"]
V2 = dict(V1, version=2, system_mode="turn", system_join="", system_open="<|system|>",
          tool={"open": "<|tool|>", "close": "", "call_open": "<|tool_call|>", "call_join": "\n"},
          tools={"join": "\n\n", "sep": "\n"}, reserved=V1["reserved"] + V2_CONTROL)
LEGACY_WORD = record("paperkiln", "legacy-word", system_mode="fold", system_join="\n\n", user_open="user: ",
                     user_close=" ", assistant_open="assistant: ", assistant_close=" ",
                     generation_prompt="assistant:")
_CHATML = dict(system_mode="turn", system_open="<|im_start|>system\n", system_close="<|im_end|>\n",
               user_open="<|im_start|>user\n", user_close="<|im_end|>\n", assistant_open="<|im_start|>assistant\n",
               assistant_close="<|im_end|>\n", generation_prompt="<|im_start|>assistant\n",
               reserved=["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
QWEN25 = record("chatml-qwen2.5", 1, **_CHATML,
                default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                match=["d5495a1e5db0611132a97e46a65dbb64a642a499421228b9c8b93229097fa9a4"])
QWEN3 = record("chatml-qwen3", 1, **_CHATML, past_assistant="strip_think",
               generation_prompt_nothink="<|im_start|>assistant\n<think>\n\n</think>\n\n",
               match=["57f1fd00f0013a2be96aa79b857391f27e23df5b5f847072b524c897e24d0361"])
GEMMA3 = record("gemma3", 1, bos="<bos>", content="trim", system_mode="fold", system_join="\n\n",
                user_open="<start_of_turn>user\n", user_close="<end_of_turn>\n",
                assistant_open="<start_of_turn>model\n", assistant_close="<end_of_turn>\n",
                generation_prompt="<start_of_turn>model\n",
                reserved=["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"],
                match=["7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4"])
REGISTRY = [V1, V2, LEGACY_WORD, QWEN25, QWEN3, GEMMA3]


def record_id(r):
    return f"{r['name']}/{r['version']}"


def resolve(template_text, declared=None):
    if declared:
        for r in REGISTRY:
            if record_id(r) == declared:
                return r, "declared"
        raise SystemExit(f"paperkiln: no chat template '{declared}' (known: {', '.join(map(record_id, REGISTRY))})")
    digest = hashlib.sha256(template_text.encode("utf-8")).hexdigest()
    for r in REGISTRY:
        if digest in r["match"]:
            return r, f"tokenizer.chat_template sha256 {digest[:12]}"
    return None, ("no declared template, no paperkiln specials, and no known tokenizer.chat_template or markers: "
                  "raw completion only")


def py_strip(text):
    return text.strip()  # the record's "trim" is exactly Python's str.strip()


def parse_messages(items):
    out = []
    for m in items:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise PaperkilnError("every message needs a role and a string content")
        x = {"role": m.get("role") if isinstance(m.get("role"), str) else "", "content": m["content"],
             "tool_calls": [], "has_tool_calls": "tool_calls" in m, "has_tool_call_id": "tool_call_id" in m,
             "tool_call_id": m.get("tool_call_id")}
        for c in (m.get("tool_calls") or []):
            if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
                raise PaperkilnError("a tool call is {id?, type?: function, function: {name, arguments}}")
            f = c["function"]
            if not isinstance(f.get("name"), str) or not f["name"] or "\n" in f["name"]:
                raise PaperkilnError("a tool call's name is a non-empty string without a newline")
            if "arguments" in f and not isinstance(f["arguments"], str):
                raise PaperkilnError("a tool call's arguments are a string (rendered verbatim)")
            x["tool_calls"].append({"id": c.get("id"), "name": f["name"], "arguments": f.get("arguments", "")})
        out.append(x)
    return out


def check_structure(m, prompt, tools_ok):
    if not m:
        raise PaperkilnError("a conversation needs a non-empty messages list")
    for x in m:
        if x["role"] == "tool" and not tools_ok:
            raise PaperkilnError("role 'tool' is reserved: no template defines it yet")
        if x["role"] not in ("system", "user", "assistant", "tool"):
            raise PaperkilnError(f"unknown role '{x['role']}'")
        if x["has_tool_calls"] and (not tools_ok or x["role"] != "assistant"):
            raise PaperkilnError("tool_calls belong on assistant messages of a template with tool turns")
        if x["has_tool_call_id"] and x["role"] != "tool":
            raise PaperkilnError("tool_call_id belongs on tool messages")
    first = 1 if m[0]["role"] == "system" else 0
    if first == len(m):
        raise PaperkilnError("a system message needs a user message after it")
    want, pending = "user", 0
    for i in range(first, len(m)):
        role = m[i]["role"]
        if role == "system":
            raise PaperkilnError("a system message is allowed only as the first message")
        if role != want:
            rule = ("user and assistant alternate from the user" if not tools_ok else
                    "user, then assistant; an assistant message with k tool calls, then k tool messages, then assistant")
            raise PaperkilnError(f"message {i} is {role}, expected {want} ({rule})")
        if role == "user":
            want = "assistant"
        elif role == "assistant":
            pending = len(m[i]["tool_calls"])
            want = "tool" if pending else "user"
        else:
            pending -= 1
            want = "tool" if pending else "assistant"
    last = m[-1]["role"]
    if prompt and not (last == "user" or (last == "tool" and pending == 0)):
        raise PaperkilnError("a prompt conversation ends on a user message"
                             + (" or on the last tool message of a call" if tools_ok else ""))
    if not prompt and last != "assistant":
        raise PaperkilnError("a training conversation ends on an assistant message")
    return first


def tool_json(d):
    def dump(x):
        if isinstance(x, dict):
            return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": " + dump(v) for k, v in x.items()) + "}"
        if isinstance(x, list):
            return "[" + ", ".join(dump(v) for v in x) + "]"
        if isinstance(x, float):
            raise PaperkilnError("a tool definition holds a non-integer number (refused: its text is not portable)")
        return json.dumps(x, ensure_ascii=False)
    if not isinstance(d, dict):
        raise PaperkilnError("a tool definition is a JSON object")
    return dump(d)


def render(t, messages, generation_prompt, thinking=-1, tools=()):
    if tools and not t["tools"]:
        raise PaperkilnError("this model's template has no tool definitions")
    m = parse_messages(messages)
    first = check_structure(m, generation_prompt, t["tool"] is not None)

    def check_reserved(s):
        for r in t["reserved"]:
            if r and r in s:
                raise PaperkilnError(f"content holds the template's reserved text '{r}'")
        return s

    def body(s):
        if t["content"] == "trim":
            s = py_strip(s)
        return check_reserved(s)

    out = [t["bos"]]
    have_sys = first == 1
    sys_text = m[0]["content"] if have_sys else ""
    if not have_sys and t["default_system"]:
        have_sys, sys_text = True, t["default_system"]
    defs = t["tools"]["sep"].join(check_reserved(tool_json(d)) for d in tools) if tools else ""
    if tools:
        head = body(sys_text) if have_sys else ""
        sys_text = (head + t["tools"]["join"] if head else "") + defs
        have_sys = True
    fold_text = None
    if have_sys:
        if t["system_mode"] == "none":
            raise PaperkilnError("this model's template has no system role")
        if t["system_mode"] == "turn":
            out += [t["system_open"], sys_text if tools else body(sys_text), t["system_close"]]
        else:
            check_reserved(sys_text)
            fold_text = sys_text + t["system_join"]
    last_user = max((i for i in range(first, len(m)) if m[i]["role"] == "user"), default=first)
    for i in range(first, len(m)):
        role = m[i]["role"]
        text = body(m[i]["content"])
        if role == "user" and fold_text is not None:
            text, fold_text = fold_text + text, None
        if role == "assistant" and t["past_assistant"] == "strip_think" and i < last_user and "</think>" in text:
            text = text[text.rfind("</think>") + len("</think>"):].lstrip("\n")
        opener = {"user": t["user_open"], "assistant": t["assistant_open"]}.get(role) or (t["tool"] or {}).get("open", "")
        closer = {"user": t["user_close"], "assistant": t["assistant_close"]}.get(role)
        out += [opener, text]
        for c in m[i]["tool_calls"]:
            out += [t["tool"]["call_open"], check_reserved(c["name"]) + t["tool"]["call_join"] + check_reserved(c["arguments"])]
        out.append(closer if closer is not None else (t["tool"] or {}).get("close", ""))
    if generation_prompt:
        out.append(t["generation_prompt_nothink"] if thinking == 0 and t["generation_prompt_nothink"] is not None
                   else t["generation_prompt"])
    elif t["past_assistant"] == "strip_think":
        raise PaperkilnError("a strip_think template renders prompt conversations only (HF re-wraps the reasoning "
                             "of replies after the last user message; prompts never have one)")
    return "".join(out)


def make_renderer(declared):
    def render_request(request):
        if request.continue_final_message:
            return Skipped("paperkiln has no continue_final_message")
        if request.documents is not None:
            return Skipped("paperkiln has no documents")
        t, why = resolve(request.template, declared)
        if t is None:
            return Skipped(f"paperkiln: {why}")
        enable = request.kwargs.get("enable_thinking")
        thinking = -1 if enable is None else (1 if enable else 0)
        try:
            return Rendered(render(t, request.messages, request.add_generation_prompt, thinking, request.tools or []))
        except PaperkilnError as exc:
            return Raised(str(exc), RefusalKind.RENDER)
    return render_request


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="paperkiln example harness (harness protocol on stdin/stdout)")
    parser.add_argument("--declared", help="a record id, as a GGUF's paperkiln.chat_template declares one "
                                           "(e.g. paperkiln/1, chatml-qwen2.5/1)")
    args = parser.parse_args()
    if args.declared:
        resolve("", args.declared)  # fail at start on an unknown id
    serve({"name": "paperkiln", "version": "paperkiln 877fb0d0 chat_template.hpp", "language": "c++",
           "homepage": "seed 003: paperkiln chat_template.hpp"}, make_renderer(args.declared),
          build=harness_build(__file__, configuration=f"declared={args.declared}" if args.declared else None))
