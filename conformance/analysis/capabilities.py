"""Capability goldens: what each template can do, found by differential rendering with the reference.

Like llama.cpp's template auto-parser, every answer comes from rendering the template twice with one input
changed and diffing the two outputs (common prefix / common suffix). Inputs carry sentinel strings that no
template contains, so a marker is located by where the sentinel lands. The differentials (docs/capabilities.md
has the table):

    G1 generation_prompt  [user]                      add_generation_prompt false vs true -> appended suffix
    E1 end_of_turn        [user, assistant]           text after the assistant sentinel (the turn's closer)
    S1 system             [user] vs [system, user]    refused / dropped / own turn / folded into the user turn
    T1 tool definitions   [user] without vs with tools -> tool name rendered / output changed / ignored
    T2 tool calls         [user, assistant ""] vs [user, assistant tool_call] -> call section, format class
    T3 argument types     T2 with arguments as an object vs as a JSON string
    T4 parallel calls     T2 with two calls: both names rendered?
    T5 tool results       [user, assistant tool_call, tool result] -> result rendered?
    R1 reasoning          [user, assistant] without vs with reasoning_content -> rendered, start/end markers
    R2 enable_thinking    generation prompt with enable_thinking true vs false (forced-open prefill)
    R3 past reasoning     R1 followed by a user turn: is the reasoning of a replayed turn kept?
    R4 think in content   past assistant content "<think>R</think>A": does the template strip it?

Each capability golden is goldens/<template-id>/capabilities.json. Reference failures (Errored/Skipped) make
the template a failure: no golden is written and the old one is kept.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.judge.goldens import CAPABILITIES_FILE, atomic_write, goldens_dir
from runners.base import Errored, Outcome, Raised, Rendered, RenderRequest, Skipped

FORMAT_VERSION = 1

# Sentinels: unique, plain ASCII, no characters a template might escape or split on.
USER = "CGUSERq7f3a"
USER2 = "CGUSERz5k2w"
ASSISTANT = "CGASSISTANTx9c1e"
SYSTEM = "CGSYSTEMb4b2d"
REASONING = "CGREASONINGm5e8a"
TOOL = "cg_probe_tool"
TOOL2 = "cg_second_tool"
ARG = "cg_probe_arg"
VALUE = "CGVALUEk3d7b"
RESULT = "CGRESULTp8f2c"
CALL_ID = "call00001"


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": "A probe tool.",
        "parameters": {"type": "object", "properties": {ARG: {"type": "string", "description": "A probe argument."}},
                       "required": [ARG]}}}


TOOLS = [_tool(TOOL), _tool(TOOL2)]


def _call(name: str, call_id: str, string_arguments: bool = False) -> dict:
    arguments = {ARG: VALUE}
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments) if string_arguments else arguments}}


def _user(text: str = USER) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str = ASSISTANT, **extra) -> dict:
    return {"role": "assistant", "content": text, **extra}


# name -> (messages, tools, add_generation_prompt, kwargs). One RenderRequest each per template.
PROBES: dict[str, tuple] = {
    "user": ([_user()], None, False, {}),
    "user_gp": ([_user()], None, True, {}),
    "user_assistant": ([_user(), _assistant()], None, False, {}),
    "system_user": ([{"role": "system", "content": SYSTEM}, _user()], None, False, {}),
    "user_tools": ([_user()], TOOLS, False, {}),
    "call_plain": ([_user(), _assistant("")], TOOLS, False, {}),
    "call_object": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID)])], TOOLS, False, {}),
    "call_string": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID, True)])], TOOLS, False, {}),
    "call_parallel": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID), _call(TOOL2, "call00002")])],
                      TOOLS, False, {}),
    "call_result": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID)]),
                     {"role": "tool", "tool_call_id": CALL_ID, "name": TOOL, "content": RESULT}], TOOLS, False, {}),
    "reasoning_last": ([_user(), _assistant(reasoning_content=REASONING)], None, False, {}),
    "reasoning_past": ([_user(), _assistant(reasoning_content=REASONING), _user(USER2)], None, True, {}),
    "think_in_content_past": ([_user(), _assistant(f"<think>{REASONING}</think>{ASSISTANT}"), _user(USER2)],
                              None, True, {}),
    "thinking_on_gp": ([_user()], None, True, {"enable_thinking": True}),
    "thinking_off_gp": ([_user()], None, True, {"enable_thinking": False}),
    "thinking_on": ([_user()], None, False, {"enable_thinking": True}),
    "thinking_off": ([_user()], None, False, {"enable_thinking": False}),
}


def probe_requests(template: str, bos_token: Optional[str], eos_token: Optional[str],
                   template_id: Optional[str] = None, always_tools: bool = False) -> list[RenderRequest]:
    """The probe renders of one template, in PROBES order (case_id labels are `capabilities:<probe>`).

    always_tools: pass the tool list to every probe, for templates that refuse to render without tools.
    """
    return [RenderRequest.make(template=template, messages=messages, bos_token=bos_token, eos_token=eos_token,
                          tools=TOOLS if always_tools else tools, add_generation_prompt=gp, kwargs=kwargs,
                          template_id=template_id,
                          case_id=f"capabilities:{name}")
            for name, (messages, tools, gp, kwargs) in PROBES.items()]


# --- diff helpers -------------------------------------------------------------------------------------------

def common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def diff_middle(left: str, right: str) -> tuple[str, str, str, str]:
    """(prefix, left middle, right middle, suffix) with the common prefix/suffix cut at tag boundaries.

    As in llama.cpp's calculate_diff_split: a cut inside `<...>` or `[...]` would split a marker
    (`<|im_end|>` vs `<tool_call>` share the `<`), so the prefix backs off to the tag's opening bracket and
    the suffix moves forward past the tag's closing bracket.
    """
    p = common_prefix_length(left, right)
    p = _back_off_open_tag(left, p)
    rest_left, rest_right = left[p:], right[p:]
    s = common_prefix_length(rest_left[::-1], rest_right[::-1])
    s = _forward_past_close_tag(rest_left, rest_right, s)
    end_left, end_right = len(rest_left) - s, len(rest_right) - s
    return left[:p], rest_left[:end_left], rest_right[:end_right], rest_left[end_left:]


def _back_off_open_tag(text: str, p: int) -> int:
    for opener, closer in (("<", ">"), ("[", "]")):
        last_open, last_close = text.rfind(opener, 0, p), text.rfind(closer, 0, p)
        if last_open > last_close and last_open >= 0:
            p = min(p, last_open)
    return p


def _forward_past_close_tag(left: str, right: str, s: int) -> int:
    """Shrink a common suffix of length s so it does not start inside a tag."""
    while s > 0:
        suffix = left[len(left) - s:]
        inside = False
        for opener, closer in (("<", ">"), ("[", "]")):
            first_close, first_open = suffix.find(closer), suffix.find(opener)
            if first_close >= 0 and (first_open < 0 or first_close < first_open):
                inside = True
                s -= first_close + 1
                break
        if not inside:
            break
    return max(s, 0)


_TAG_BEFORE = re.compile(r"(<[^<>]*>|\[[^\[\]]*\])\s*$")
_TAG_AFTER = re.compile(r"^\s*(<[^<>]*>|\[[^\[\]]*\])")


def marker_before(text: str, pos: int) -> Optional[str]:
    """The tag (`<think>`, `[THINK]`) right before pos, whitespace allowed in between; None if there is none."""
    found = _TAG_BEFORE.search(text[:pos])
    return found.group(1) if found else None


def marker_after(text: str, pos: int) -> Optional[str]:
    found = _TAG_AFTER.match(text[pos:])
    return found.group(1) if found else None


def _first_tag(text: str) -> Optional[str]:
    found = re.search(r"<[^<>]*>|\[[^\[\]]*\]", text)
    return found.group(0) if found else None


def _last_tag(text: str) -> Optional[str]:
    found = re.findall(r"<[^<>]*>|\[[^\[\]]*\]", text)
    return found[-1] if found else None


def _json_span(text: str, must_contain: str) -> Optional[tuple[int, int]]:
    """The earliest JSON object/array in text whose source contains must_contain: (start, end)."""
    decoder = json.JSONDecoder()
    target = text.find(must_contain)
    if target < 0:
        return None
    for start in range(target):
        if text[start] not in "{[":
            continue
        try:
            _, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if end > target:
            return start, end
    return None


# --- the analysis -------------------------------------------------------------------------------------------

def _text(outcome: Outcome) -> Optional[str]:
    return outcome.text if isinstance(outcome, Rendered) else None


def _state(outcome: Outcome, sentinel: Optional[str] = None) -> str:
    """rendered / dropped (renders, sentinel absent) / raised."""
    if isinstance(outcome, Raised):
        return "raised"
    if sentinel is not None and sentinel not in outcome.text:
        return "dropped"
    return "rendered"


def generation_prompt(without: Outcome, with_: Outcome) -> dict:
    """G1: add_generation_prompt false vs true. mode: appended (pure suffix), none, changed, raised."""
    a, b = _text(without), _text(with_)
    if a is None or b is None:
        return {"mode": "raised", "text": None}
    if a == b:
        return {"mode": "none", "text": ""}
    if b.startswith(a):
        return {"mode": "appended", "text": b[len(a):]}
    prefix, _, added, _ = diff_middle(a, b)
    return {"mode": "changed", "text": added}


def end_of_turn(user_assistant: Outcome) -> Optional[str]:
    """E1: the text closing the assistant turn, exactly as rendered (after the assistant sentinel)."""
    text = _text(user_assistant)
    if text is None or ASSISTANT not in text:
        return None
    tail = text[text.rindex(ASSISTANT) + len(ASSISTANT):]
    return tail or None


def system_role(user: Outcome, system_user: Outcome, user_end: Optional[str]) -> str:
    """S1: [user] vs [system, user].

    raised -> "refused"; system text absent -> "dropped"; the user turn's own closer (what follows the user
    sentinel in [user]) appears between the system and user sentinels -> "own-turn"; otherwise the system
    text sits inside the user turn -> "folded".
    """
    if isinstance(system_user, Raised):
        return "refused"
    text = system_user.text
    if SYSTEM not in text:
        return "dropped"
    between = text[text.index(SYSTEM) + len(SYSTEM):text.find(USER, text.index(SYSTEM))]
    if USER not in text[text.index(SYSTEM):]:
        return "own-turn"  # system placed after the user turn
    closer = (user_end or "").strip()
    if closer and closer in between:
        return "own-turn"
    user_text = _text(user)
    if user_text is not None and USER in user_text:
        # The header the user turn gets on its own; if it reappears after the system text, the system has its own turn.
        header = _last_tag(user_text[:user_text.index(USER)])
        if header and header in between:
            return "own-turn"
    return "folded"


def _user_closer(user: Outcome) -> Optional[str]:
    text = _text(user)
    if text is None or USER not in text:
        return None
    return text[text.index(USER) + len(USER):] or None


def tool_definitions(user: Outcome, user_tools: Outcome) -> str:
    """T1: [user] without vs with tools -> rendered (tool name in output), changed, ignored, raised."""
    if isinstance(user_tools, Raised):
        return "raised"
    if TOOL in user_tools.text:
        return "rendered"
    if _text(user) != user_tools.text:
        return "changed"
    return "ignored"


def tool_call_format(plain: Outcome, call: Outcome, user_tools: Optional[Outcome] = None,
                     header: Optional[str] = None, closer: Optional[str] = None) -> dict:
    """T2: [user, assistant ""] vs [user, assistant tool_call] -> the call section, its class and markers.

    If the empty assistant turn raises, the baseline is [user] with tools instead (header/closer trimmed).
    Classes follow llama.cpp's auto-parser: json-native (the function name is a JSON string value or key),
    tag-json (name outside JSON, arguments a JSON object), tag-tagged (argument names outside JSON too).
    """
    if isinstance(call, Raised):
        return {"calls": "raised", "format": None, "start": None, "end": None}
    text = call.text
    if TOOL not in text:
        return {"calls": "dropped", "format": None, "start": None, "end": None}
    section = None
    if _text(plain) is not None:
        _, _, section, _ = diff_middle(plain.text, text)
    if (section is None or TOOL not in section) and _text(user_tools) is not None:
        # An empty assistant turn may be refused: diff against the user turn alone and cut the assistant
        # header (the generation prompt) and the turn's closer off the added text.
        _, _, section, _ = diff_middle(user_tools.text, text)
        if header and section.startswith(header):
            section = section[len(header):]
        if closer and section.endswith(closer):
            section = section[:-len(closer)]
    if section is None or TOOL not in section:
        section = text
    name_at = section.index(TOOL)
    before_name = section[:name_at]
    format_class, start, end = None, None, None
    span = _json_span(section, TOOL)
    if span and span[0] < name_at < span[1] and re.search(r'[{:,\[]\s*"$', before_name):
        format_class = "json-native"
        start, end = section[:span[0]], section[span[1]:]
    else:
        args_span = _json_span(section[name_at:], f'"{ARG}"')
        if args_span is not None:
            format_class = "tag-json"
            end = section[name_at + args_span[1]:]
        else:
            format_class = "tag-tagged"
            value_at = section.rfind(VALUE)
            end = section[value_at + len(VALUE):] if value_at >= 0 else None
            if end is not None:
                # the value's own closer (</parameter>) is argument syntax; keep what closes the call
                end = re.sub(r"^\s*</?[^<>]*>", "", end, count=1) if re.match(r"^\s*</", end) else end
        start = before_name
    if end and closer and closer.strip() and end.rstrip().endswith(closer.strip()):
        end = end.rstrip()[:-len(closer.strip())]
    return {"calls": "rendered", "format": format_class,
            "start": (start or "").strip() or None, "end": (end or "").strip() or None,
            "section": section}


def argument_types(call_object: Outcome, call_string: Outcome) -> dict:
    """T3: arguments as an object vs as a JSON string: which render the argument value."""
    def ok(outcome: Outcome) -> bool:
        return isinstance(outcome, Rendered) and VALUE in outcome.text

    string_text = _text(call_string) or ""
    return {"object": ok(call_object), "string": ok(call_string),
            # a string printed through tojson shows escaped quotes: the template re-encodes it
            "string_reencoded": ok(call_string) and f'\\"{ARG}\\"' in string_text}


def parallel_calls(call_parallel: Outcome) -> str:
    """T4: two calls in one assistant turn: both rendered / first only / raised."""
    if isinstance(call_parallel, Raised):
        return "raised"
    names = [name in call_parallel.text for name in (TOOL, TOOL2)]
    return "both" if all(names) else ("first-only" if names[0] else "none")


def tool_results(call_result: Outcome) -> str:
    """T5: a tool message after the call: rendered / dropped / raised."""
    return _state(call_result, RESULT)


def reasoning(user_assistant: Outcome, last: Outcome, past: Outcome, think_in_content: Outcome,
              on_gp: Outcome, off_gp: Outcome, on: Outcome, off: Outcome, default_gp: Optional[str]) -> dict:
    """R1-R4: reasoning_content rendering, its markers, enable_thinking, past-turn stripping."""
    result: dict = {}
    # R1: with vs without reasoning_content on the last assistant turn.
    last_text = _text(last)
    result["rendered"] = _state(last, REASONING) if not isinstance(last, Raised) else "raised"
    start = end = None
    if last_text is not None and REASONING in last_text:
        at = last_text.index(REASONING)
        start = marker_before(last_text, at)
        end = marker_after(last_text, at + len(REASONING))
    # R2: enable_thinking true vs false, on the generation prompt (and on the prompt without it).
    on_text, off_text = _text(on_gp), _text(off_gp)
    thinking: dict = {"effect": "raised" if on_text is None or off_text is None else
                      ("none" if on_text == off_text else "changes")}
    if thinking["effect"] == "changes":
        _, on_mid, off_mid, _ = diff_middle(on_text, off_text)
        thinking["when_true"], thinking["when_false"] = on_mid, off_mid
        # markers from an empty think block the switch adds, if R1 found none
        for mid in (off_mid, on_mid):
            if start is None and _first_tag(mid) and _last_tag(mid) != _first_tag(mid):
                start, end = _first_tag(mid), _last_tag(mid)
    if _text(on) is not None and _text(off) is not None:
        thinking["changes_prompt_without_generation"] = _text(on) != _text(off)
    result["enable_thinking"] = thinking
    result["start"], result["end"] = start, end
    # R3: a replayed (past) assistant turn with reasoning_content.
    # "not-rendered": the template never shows reasoning_content, so there is nothing to strip.
    past_state = {"rendered": "kept", "dropped": "stripped", "raised": "raised"}[_state(past, REASONING)]
    result["past_turns"] = "not-rendered" if result["rendered"] != "rendered" and past_state == "stripped" else past_state
    # R4: reasoning embedded in past content.
    r4 = _state(think_in_content, REASONING)
    result["think_in_content_past"] = {"rendered": "kept", "dropped": "stripped", "raised": "raised"}[r4]
    if start is None and r4 == "dropped":
        # R4 differential: the template cut our <think>...</think> out of content, so those are its markers.
        past_text = _text(think_in_content)
        if past_text is not None and ASSISTANT in past_text:
            start, end = "<think>", "</think>"
            result["start"], result["end"] = start, end
    # Forced open: the generation prompt ends with the start marker and does not close it.
    forced = False
    if default_gp and start:
        forced = default_gp.rstrip().endswith(start)
    result["forced_open"] = forced
    return result


def analyze(outcomes: dict) -> dict:
    """The capability record from the probe outcomes (probe name -> Rendered/Raised)."""
    o = outcomes
    gp = generation_prompt(o["user"], o["user_gp"])
    eot = end_of_turn(o["user_assistant"])
    call = tool_call_format(o["call_plain"], o["call_object"], o["user_tools"], gp["text"], eot)
    section = call.pop("section", None)
    caps = {
        "format": FORMAT_VERSION,
        "renders": "raised" if isinstance(o["user"], Raised) else "rendered",
        "generation_prompt": gp,
        "end_of_turn": eot,
        "system_role": system_role(o["user"], o["system_user"], _user_closer(o["user"])),
        "tools": {
            "definitions": tool_definitions(o["user"], o["user_tools"]),
            "calls": call["calls"],
            "results": tool_results(o["call_result"]),
            "arguments": argument_types(o["call_object"], o["call_string"]),
            "parallel": parallel_calls(o["call_parallel"]),
            "format": call["format"],
            "call_start": call["start"],
            "call_end": call["end"],
            "call_example": section,
        },
        "reasoning": reasoning(o["user_assistant"], o["reasoning_last"], o["reasoning_past"],
                               o["think_in_content_past"], o["thinking_on_gp"], o["thinking_off_gp"],
                               o["thinking_on"], o["thinking_off"], gp["text"]),
    }
    return caps


def _check_reference(outcome_list: list) -> dict:
    named = dict(zip(PROBES, outcome_list))
    for name, outcome in named.items():
        if isinstance(outcome, (Errored, Skipped)):
            detail = outcome.message
            raise ValueError(f"probe {name}: {outcome.kind}: {detail}")
    return named


def needs_tools(outcome_list: list) -> bool:
    """T0: [user] raises but [user] with tools renders: probe again with tools everywhere."""
    named = dict(zip(PROBES, outcome_list))
    return isinstance(named["user"], Raised) and isinstance(named["user_tools"], Rendered)


def capabilities_from_outcomes(outcome_list: list, always_tools: bool = False) -> dict:
    """Analyze outcomes given in probe_requests order. ValueError if the reference itself failed."""
    caps = analyze(_check_reference(outcome_list))
    caps["requires_tools"] = always_tools
    return caps


# --- goldens ------------------------------------------------------------------------------------------------

def capabilities_path(template_id: str, root: Optional[Path] = None) -> Path:
    return (root or goldens_dir()) / template_id / CAPABILITIES_FILE


def encode_capabilities(caps: dict) -> bytes:
    return (json.dumps(caps, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8", "surrogatepass")


def load_capabilities(template_id: str, root: Optional[Path] = None) -> Optional[dict]:
    path = capabilities_path(template_id, root)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="surrogatepass"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def compute_capabilities(templates: Iterable, runner) -> tuple[dict, list]:
    """template id -> capability record, plus failures [(template id, message)]; one render_many batch."""
    templates = list(templates)
    requests = []
    for entry in templates:
        requests.extend(probe_requests(entry.source(), entry.bos_token, entry.eos_token, entry.id))
    outcomes = list(runner.render_many(requests))
    per = len(PROBES)
    chunks = {entry.id: outcomes[index * per:(index + 1) * per] for index, entry in enumerate(templates)}
    retry = [entry for entry in templates if needs_tools(chunks[entry.id])]
    if retry:
        again = []
        for entry in retry:
            again.extend(probe_requests(entry.source(), entry.bos_token, entry.eos_token, entry.id, always_tools=True))
        outcomes = list(runner.render_many(again))
        for index, entry in enumerate(retry):
            chunks[entry.id] = outcomes[index * per:(index + 1) * per]
    retried = {entry.id for entry in retry}
    results, failures = {}, []
    for entry in templates:
        try:
            results[entry.id] = capabilities_from_outcomes(chunks[entry.id], entry.id in retried)
        except ValueError as exc:
            failures.append((entry.id, str(exc)))
    return results, failures


def update_capability_goldens(templates: Iterable, runner, root: Optional[Path] = None,
                              progress: Optional[Callable[[int, int], None]] = None) -> tuple[int, list]:
    """Write goldens/<id>/capabilities.json for each template; returns (files changed, failures)."""
    results, failures = compute_capabilities(templates, runner)
    written = 0
    for done, (template_id, caps) in enumerate(sorted(results.items()), 1):
        path = capabilities_path(template_id, root)
        data = encode_capabilities(caps)
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data)
            written += 1
        if progress:
            progress(done, len(results))
    return written, failures

