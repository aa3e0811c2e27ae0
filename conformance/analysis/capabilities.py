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
  seed-002 (llama.cpp's auto-parser analyses, our own probes):
    U1 turn openers       [user, assistant, user2]    the text that opens a user turn, an assistant turn
    C1 content mode       content vs a tool call      plain / always-wrapped / conditional (only with reasoning)
    R3 reasoning scope    reasoning + content vs reasoning + tool call -> content-and-tools / tools-only / ...
    T2 section, per call  one call vs two calls       what the second call repeats is per-call markup
    T3 function markers   the call's text             name prefix / suffix, the close after the arguments
    A1/A2, T5, T6         tagged arguments            name/value markers, separator (two arguments),
                                                      container (no arguments)
    T7 call id            where call00001 lands       pre-func-name / between-func-and-args / post-args / json-field
    J  JSON fields        the JSON call object        name/arguments/id field names, name as key, array
    P  preserved tokens   all of the above            every marker found

Each capability golden is goldens/<template-id>/capabilities.json. Reference failures (Errored/Skipped) make
the template a failure: no golden is written and the old one is kept.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.files import atomic_write
from conformance.judge.goldens import (
    CAPABILITIES_FILE,
    encode_record,
    goldens_dir,
    load_record,
)
from runners.base import Errored, Outcome, Raised, Rendered, RenderRequest, Skipped

FORMAT_VERSION = 2

# Sentinels: unique, plain ASCII, no characters a template might escape or split on.
USER = "CGUSERq7f3a"
USER2 = "CGUSERz5k2w"
ASSISTANT = "CGASSISTANTx9c1e"
SYSTEM = "CGSYSTEMb4b2d"
REASONING = "CGREASONINGm5e8a"
TOOL = "cg_probe_tool"
TOOL2 = "cg_second_tool"
ARG = "cg_probe_arg"
ARG2 = "cg_other_arg"
VALUE = "CGVALUEk3d7b"
VALUE2 = "CGVALUEw6n4q"
RESULT = "CGRESULTp8f2c"
CALL_ID = "call00001"


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": "A probe tool.",
        "parameters": {"type": "object", "properties": {
            ARG: {"type": "string", "description": "A probe argument."},
            ARG2: {"type": "string", "description": "Another probe argument."}},
            "required": [ARG]}}}


TOOLS = [_tool(TOOL), _tool(TOOL2)]


def _call(name: str, call_id: str, string_arguments: bool = False, arguments: Optional[dict] = None) -> dict:
    arguments = {ARG: VALUE} if arguments is None else arguments
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
    # seed-002's differentials: the user turn's header, content wrapping, reasoning scope, function-name
    # markers (two names), argument separator (two arguments), argument container (no arguments).
    "user_assistant_user": ([_user(), _assistant(), _user(USER2)], None, False, {}),
    "content_tools": ([_user(), _assistant()], TOOLS, False, {}),
    "reasoning_content_tools": ([_user(), _assistant(reasoning_content=REASONING)], TOOLS, False, {}),
    "reasoning_call": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID)], reasoning_content=REASONING)],
                       TOOLS, False, {}),
    "call_other_name": ([_user(), _assistant("", tool_calls=[_call(TOOL2, CALL_ID)])], TOOLS, False, {}),
    "call_two_args": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID, arguments={ARG: VALUE, ARG2: VALUE2})])],
                      TOOLS, False, {}),
    "call_no_args": ([_user(), _assistant("", tool_calls=[_call(TOOL, CALL_ID, arguments={})])], TOOLS, False, {}),
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


_REASONING_WORD = re.compile(r"think|reason|thought", re.IGNORECASE)


def _switch_markers(mid: str) -> tuple[Optional[str], Optional[str]]:
    """(start, end) of the reasoning block an enable_thinking switch adds: the first and last tags named for
    reasoning (`<think>`, `[THINK]`, `<seed:think>`), a lone one as the start (Ling's forced-open `<think>`),
    or two tags of any name when they are all the block has."""
    tags = re.findall(r"<[^<>]*>|\[[^\[\]]*\]", mid)
    named = [tag for tag in tags if _REASONING_WORD.search(tag)]
    if len(named) >= 2 and named[0] != named[-1]:
        return named[0], named[-1]
    if len(named) == 1:
        return named[0], None
    if len(tags) == 2 and tags[0] != tags[1]:
        return tags[0], tags[1]
    return None, None


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
        # the name shows only in the tool definitions: the call itself is not rendered (Granite 3.3)
        return {"calls": "dropped", "format": None, "start": None, "end": None}
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
        # markers from an empty think block the switch adds, if R1 found none: its reasoning tags (the switch
        # may change a system prompt too, SmolLM3's "/no_think", whose turn tags are no reasoning markers)
        for mid in (off_mid, on_mid):
            if start is None:
                start, end = _switch_markers(mid)
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


# --- seed-002: turns, content, reasoning scope, the anatomy of a tool call ------------------------------------

_TAG_RUN = re.compile(r"^(?:\s*(?:<[^<>]*>|\[[^\[\]]*\]))+")
_TAG_RUN_END = re.compile(r"(?:(?:<[^<>]*>|\[[^\[\]]*\])\s*)+$")


def _clean(text: Optional[str]) -> Optional[str]:
    """A marker as recorded: surrounding whitespace dropped, empty as null."""
    return (text or "").strip() or None


def leading_tags(text: str) -> tuple[str, str]:
    """(the run of complete tags that opens text, the rest)."""
    found = _TAG_RUN.match(text)
    return (found.group(0), text[found.end():]) if found else ("", text)


def trailing_tags(text: str) -> tuple[str, str]:
    """(the rest, the run of complete tags that ends text)."""
    found = _TAG_RUN_END.search(text)
    return (text[:found.start()], text[found.start():]) if found else (text, "")


def _common_suffix(a: str, b: str) -> str:
    n = common_prefix_length(a[::-1], b[::-1])
    n = _forward_past_close_tag(a, b, n)
    return a[len(a) - n:] if n else ""


def _without_leading(text: str, closers: Iterable[Optional[str]]) -> str:
    """text without the closing tags of the turn before it at its start (`<|im_end|>` before `<|im_start|>user`)."""
    text = text.lstrip()
    for closer in closers:
        closer = (closer or "").strip()
        if closer and text.startswith(closer):
            text = text[len(closer):].lstrip()
            continue
        tag = _first_tag(closer)
        if tag and text.startswith(tag):
            text = text[len(tag):].lstrip()
    return text


def turn_starts(user: Outcome, user_assistant: Outcome, user_assistant_user: Outcome, eot: Optional[str],
                content_start: Optional[str]) -> dict:
    """The text that opens a user turn and an assistant turn, as llama.cpp's user_start/assistant_start.

    user: what the second user turn of [user, assistant, user2] and the lone user turn of [user] share right
    before their sentinels, without the previous turn's closer. assistant: what stands between the user turn's
    closer (what follows the user sentinel in [user]) and the assistant sentinel in [user, assistant], cut at a
    reasoning tag (Qwen3 opens past turns with an empty think block) and without a content wrapper."""
    result = {"user_start": None, "assistant_start": None}
    alone, pair, three = _text(user), _text(user_assistant), _text(user_assistant_user)
    if alone is None or USER not in alone:
        return result
    head, closer = alone[:alone.index(USER)], alone[alone.index(USER) + len(USER):]
    if three is not None and ASSISTANT in three and USER2 in three[three.index(ASSISTANT):]:
        gap = three[three.index(ASSISTANT) + len(ASSISTANT):three.index(USER2, three.index(ASSISTANT))]
        result["user_start"] = _clean(_without_leading(_common_suffix(head, gap), (eot, closer)))
    if pair is not None and USER in pair and ASSISTANT in pair[pair.index(USER):]:
        gap = _without_leading(pair[pair.index(USER) + len(USER):pair.index(ASSISTANT, pair.index(USER))], (closer,))
        for tag in re.findall(r"<[^<>]*>|\[[^\[\]]*\]", gap):
            if _REASONING_WORD.search(tag):
                gap = gap[:gap.index(tag)]
                break
        if content_start and gap.rstrip().endswith(content_start):
            gap = gap.rstrip()[:-len(content_start)]
        result["assistant_start"] = _clean(gap)
    return result


def content_mode(content: Outcome, other: Optional[Outcome], with_reasoning: Outcome,
                 reasoning_end: Optional[str]) -> dict:
    """C1: how assistant content is wrapped.

    `plain`: content alone against a tool call (or an empty turn), the content side of the diff is the content
    itself; `always-wrapped`: it carries tags around the content (`<|START_RESPONSE|>A<|END_RESPONSE|>`);
    `conditional`: plain, but with reasoning present the content gets tags of its own (Granite 3.3's
    `<response>`). `raised` when the content probe raises."""
    text, base = _text(content), _text(other)
    if text is None or ASSISTANT not in text:
        return {"mode": "raised" if text is None else "dropped", "start": None, "end": None}
    if base is not None:
        _, left, _, _ = diff_middle(text, base)
    else:
        left = ASSISTANT
    if ASSISTANT in left:
        at = left.index(ASSISTANT)
        before, after = trailing_tags(left[:at])[1], leading_tags(left[at + len(ASSISTANT):])[0]
        if before.strip() and after.strip():
            return {"mode": "always-wrapped", "start": _clean(before), "end": _clean(after)}
    reasoned = _text(with_reasoning)
    if reasoned is not None and ASSISTANT in reasoned:
        _, _, right, _ = diff_middle(text, reasoned)
        if reasoning_end and reasoning_end in right:
            right = right[right.index(reasoning_end) + len(reasoning_end):]
        if ASSISTANT in right:
            at = right.index(ASSISTANT)
            before, after = trailing_tags(right[:at])[1], leading_tags(right[at + len(ASSISTANT):])[0]
            if before.strip() and after.strip():
                return {"mode": "conditional", "start": _clean(before), "end": _clean(after)}
    return {"mode": "plain", "start": None, "end": None}


def reasoning_scope(with_content: Outcome, with_call: Outcome, start: Optional[str], end: Optional[str]) -> dict:
    """R3 (seed-002): reasoning next to content vs next to a tool call (tools given in both).

    scope: content-and-tools / tools-only / content-only / none / raised; mode as llama.cpp's: `tag-based`
    (a start or end marker is known), `tools-only` (only beside a tool call),
    `untagged` (rendered without markers), `none`; markers found by R2/R4 alone (reasoning never replayed, as
    DeepSeek-R1) make it `tag-based` too."""
    content, call = _text(with_content), _text(with_call)
    if content is None and call is None:
        return {"scope": "raised", "mode": "none"}
    in_content = content is not None and REASONING in content
    in_call = call is not None and REASONING in call
    scope = {(True, True): "content-and-tools", (False, True): "tools-only", (True, False): "content-only",
             (False, False): "none"}[(in_content, in_call)]
    if scope == "tools-only":
        mode = "tools-only"
    elif start or end:
        mode = "tag-based"  # markers known from R1, R2 or R4: the model writes them even where replays drop them
    else:
        mode = "untagged" if scope != "none" else "none"
    return {"scope": scope, "mode": mode}


def _object_around(text: str, start: int, position: int) -> Optional[tuple[int, int]]:
    """The first JSON object at or after `start` whose span covers `position`."""
    decoder = json.JSONDecoder()
    for at in range(start, position):
        if text[at] != "{":
            continue
        try:
            _, end = decoder.raw_decode(text, at)
        except ValueError:
            continue
        if end > position:
            return at, end
    return None


def json_fields(section: str) -> dict:
    """For a JSON-native call: the field names of the call object (llama.cpp's function/name/args/id fields),
    whether the name is the key (`{"get_weather": {...}}`) and whether calls sit in an array."""
    fields = {"function_field": None, "name_field": None, "arguments_field": None, "id_field": None,
              "name_is_key": False, "array_wrapped": False, "parameter_order": None}
    span = _json_span(section, TOOL)
    if span is None:
        return fields
    fields["array_wrapped"] = section[span[0]] == "["
    body = _object_around(section, span[0], section.index(TOOL, span[0]))
    if body is None:
        return fields
    try:
        call = json.loads(section[body[0]:body[1]])
    except ValueError:
        return fields
    fields["parameter_order"] = list(call)

    def carries_args(value) -> bool:
        return (isinstance(value, dict) and ARG in value) or (isinstance(value, str) and ARG in value)

    def read(level: dict) -> bool:
        for key, value in level.items():
            if key == TOOL:
                fields["name_is_key"] = True
                return True
            if value == TOOL:
                fields["name_field"] = key
                fields["arguments_field"] = next((k for k, v in level.items() if carries_args(v)), None)
                return True
        return False

    if not read(call):
        for key, value in call.items():
            if isinstance(value, dict) and read(value):
                fields["function_field"] = key
                break
    if fields["name_is_key"]:
        fields["parameter_order"] = None  # the call's one key is the function's name
    fields["id_field"] = next((k for k, v in call.items() if v == CALL_ID), None)
    return fields


def _second_call(one: Outcome, two: Outcome) -> Optional[str]:
    """T2 (seed-002): what the second of two parallel calls adds, separators around it trimmed."""
    a, b = _text(one), _text(two)
    if a is None or b is None or TOOL2 not in b:
        return None
    _, _, added, _ = diff_middle(a, b)
    if TOOL2 not in added:
        return None
    return added.strip().lstrip(",").strip()


def _tag_name(tag: str) -> str:
    found = re.match(r"[<\[]/?([A-Za-z_:|\-]+)", tag.strip())
    return found.group(1).strip("|") if found else ""


_OPEN_FRAGMENT = re.compile(r"(<[^<>]*|\[[^\[\]]*)$")


def _opening_fragment(text: str) -> str:
    """The markup that opens what follows text: an unterminated tag (`<parameter=`) or the complete tags at its
    end (`<arg_key>`); whitespace kept."""
    found = _OPEN_FRAGMENT.search(text)
    return found.group(1) if found else trailing_tags(text)[1]


def _value_suffix(after_value: str) -> str:
    """The closing tag right after an argument value (`</parameter>`, `</arg_value>`), whitespace included."""
    found = re.match(r"\s*</[^<>]*>", after_value)
    return found.group(0) if found else ""


def _closing(tail: str, form: str, name_tag: str) -> tuple[str, str]:
    """(function close, markers after it) of the text that follows a call's arguments."""
    if form == "tag-tagged":
        tail = tail[len(_value_suffix(tail)):]
    text, tags = trailing_tags(tail)
    close, after = [text], []
    for tag in re.findall(r"<[^<>]*>|\[[^\[\]]*\]", tags):
        if name_tag and _tag_name(tag) == name_tag and not after:
            close.append(tag)
        else:
            after.append(tag)
    return "".join(close), "".join(after)


def _call_span(section: str, form: str, name: str, value: str) -> Optional[tuple[int, int]]:
    """(where the call's own text starts, where its arguments end) for the call of `name`: the JSON object for
    JSON-native calls, else from the name to the end of the JSON arguments or of the last value."""
    if name not in section:
        return None
    name_at = section.index(name)
    if form == "json-native":
        span = _json_span(section, name)
        body = _object_around(section, span[0], name_at) if span else None
        return body
    if form == "tag-json":
        args = _json_span(section[name_at:], f'"{ARG}"')
        return (name_at, name_at + args[1]) if args else None
    return (name_at, section.rindex(value) + len(value)) if value in section[name_at:] else None


def tool_anatomy(o: dict, call: dict, eot: Optional[str] = None, reasoning_found: Optional[dict] = None) -> dict:
    """Section vs per-call markers, function-name markers, argument markup, call-id position, JSON fields.

    From the one-call section (T2): the parallel call (T2 of seed-002: does the second call repeat the
    opening markers?), the two-argument call (separator), the argument-less call (container), the call id's
    place. Marker definitions (all trimmed, null when absent):
      section_start/end   around all calls;  per_call_start/end  around each call
      function.name_prefix/suffix  right before/after the name inside a call;  function.close  what ends the
                          call after its arguments (before per_call_end)
      argument_markers    name_prefix/suffix, value_prefix/suffix around one tagged argument; separator
                          between two arguments; start/end around all of them (tag formats)
      call_id             position (none, pre-func-name, between-func-and-args, post-args, json-field) and the
                          text right before/after the id"""
    result = {"markers": "none", "section_start": None, "section_end": None, "per_call_start": None,
              "per_call_end": None, "function": {"name_prefix": None, "name_suffix": None, "close": None},
              "argument_markers": {"name_prefix": None, "name_suffix": None, "value_prefix": None,
                                   "value_suffix": None, "separator": None, "start": None, "end": None},
              "call_id": {"position": "none", "prefix": None, "suffix": None}, "json": None}
    section, form = call.get("section"), call.get("format")
    if call.get("calls") != "rendered" or not section or TOOL not in section:
        return result
    span = _call_span(section, form, TOOL, VALUE)
    if span is None:
        return result
    name_at = section.index(TOOL)
    if form == "json-native":
        result["json"] = json_fields(section)
        outer = _json_span(section, TOOL)
        wrapped = outer is not None and section[outer[0]] == "["
        opening, tail = section[:outer[0] if wrapped else span[0]], section[outer[1] if wrapped else span[1]:]
    else:
        opening, tail = section[:name_at], section[span[1]:]
    # an empty reasoning block the template puts before the calls (Command R7B) is not a call marker
    start, end = (reasoning_found or {}).get("start"), (reasoning_found or {}).get("end")
    if start and end and opening.lstrip().startswith(start) and end in opening:
        opening = opening[opening.index(end) + len(end):]
    if eot and eot.strip() and eot.strip() in tail:  # the turn's end, and whatever the template adds after it
        tail = tail[:tail.index(eot.strip())]
    name_prefix = "" if form == "json-native" else _name_prefix(opening)
    name_tag = _tag_name(name_prefix)
    close, after = ("", tail) if form == "json-native" else _closing(tail, form, name_tag)
    # the second of two parallel calls: what it repeats of the opening and closing markers is per call
    per_start = per_end = ""
    second = _second_call(o["call_object"], o["call_parallel"])
    if second is not None:
        other = _call_span(second, form, TOOL2, VALUE)
        if other is not None:
            head = second[:other[0]] if form == "json-native" else second[:second.index(TOOL2)]
            per_start = leading_tags(head)[0].strip()
            per_end = (second[other[1]:].strip() if form == "json-native" else
                       _closing(second[other[1]:], form, name_tag)[1].strip())
    opening_markers = opening[:len(opening) - len(name_prefix)] if name_prefix else opening
    if per_start and per_start in opening_markers:
        cut = opening_markers.rindex(per_start)
        result["section_start"], result["per_call_start"] = _clean(opening_markers[:cut]), per_start
    else:
        result["section_start"] = _clean(opening_markers)
    if per_end and after.strip().startswith(per_end):
        result["per_call_end"] = per_end
        result["section_end"] = _clean(after.strip()[len(per_end):])
    else:
        result["section_end"] = _clean(after)
    if result["per_call_start"] or result["per_call_end"]:
        result["markers"] = "both" if (result["section_start"] or result["section_end"]) else "per-call"
    elif result["section_start"] or result["section_end"]:
        result["markers"] = "section"
    if form != "json-native":
        result["function"] = {"name_prefix": _clean(name_prefix), "name_suffix": _name_suffix(section, name_at, form),
                              "close": _clean(close)}
        result["argument_markers"] = argument_markers(section, form, o)
    result["call_id"] = call_id_position(section, name_at, form)
    return result


def _name_prefix(opening: str) -> str:
    """What right before the name belongs to the name: an unterminated tag (`<function=`), or the text after the
    last complete tag (DeepSeek's `function<｜tool▁sep｜>` stays with the tag it ends in)."""
    found = _OPEN_FRAGMENT.search(opening)
    if found:
        return found.group(1)
    inner = leading_tags(opening)[1]  # after the per-call/section tags: `function<｜tool▁sep｜>`
    return inner if inner.strip() else ""


def _name_suffix(section: str, name_at: int, form: str) -> Optional[str]:
    rest = section[name_at + len(TOOL):]
    stop = [at for at in (rest.find("{") if form == "tag-json" else rest.find(ARG),) if at >= 0]
    if CALL_ID in rest:
        id_at = rest.index(CALL_ID)
        before = marker_before(rest, id_at)
        stop.append(rest.rindex(before, 0, id_at) if before else id_at)
    if not stop:
        return None
    head = rest[:min(stop)]
    if form == "tag-tagged" and min(stop) == rest.find(ARG):
        head = head[:len(head) - len(_opening_fragment(head))]
    return _clean(head)


def argument_markers(section: str, form: str, o: dict) -> dict:
    """A1/A2/T5/T6 (seed-002) for tag formats: the markup around one argument name and value, the separator
    between two arguments, the container around them all."""
    marks = {"name_prefix": None, "name_suffix": None, "value_prefix": None, "value_suffix": None,
             "separator": None, "start": None, "end": None}
    if form == "tag-tagged" and ARG in section and VALUE in section:
        a, v = section.index(ARG), section.index(VALUE)
        marks["name_prefix"] = _clean(_opening_fragment(section[:a]))
        between = section[a + len(ARG):v]
        tag = re.match(r"\s*(<[^<>]*>|\[[^\[\]]*\])", between)
        first_end = tag or re.match(r"[^<>\[\]]*?[>\]]", between)
        if first_end:
            marks["name_suffix"] = _clean(first_end.group(0))
            marks["value_prefix"] = _clean(between[first_end.end():])
        else:
            marks["name_suffix"] = _clean(between)
        marks["value_suffix"] = _clean(_value_suffix(section[v + len(VALUE):]))
    two = _text(o.get("call_two_args"))
    if two is not None and VALUE in two and VALUE2 in two:
        first_value, second_arg = (VALUE, ARG2) if two.index(VALUE) < two.index(VALUE2) else (VALUE2, ARG)
        end_first = two.index(first_value) + len(first_value)
        if second_arg in two[end_first:]:
            gap = two[end_first:two.index(second_arg, end_first)]
            if form == "tag-tagged":
                gap = gap[len(_value_suffix(gap)):]
                gap = gap[:len(gap) - len(_opening_fragment(gap))]
            else:
                gap = gap.strip('"')
            marks["separator"] = gap or None
    none, one = _text(o.get("call_no_args")), _text(o.get("call_object"))
    if form == "tag-tagged" and none is not None and one is not None:
        _, left, _, _ = diff_middle(one, none)
        if ARG in left and VALUE in left:
            head = left[:left.index(ARG)]
            marks["start"] = _clean(head[:len(head) - len(_opening_fragment(head))])
            tail = left[left.rindex(VALUE) + len(VALUE):]
            marks["end"] = _clean(tail[len(_value_suffix(tail)):])
    return marks


def call_id_position(section: str, name_at: int, form: str) -> dict:
    """T7 (seed-002): where the call id sits relative to the name and the arguments, with the text around it."""
    if CALL_ID not in section:
        return {"position": "none", "prefix": None, "suffix": None}
    at = section.index(CALL_ID)
    if form == "json-native" and _json_span(section, CALL_ID):
        return {"position": "json-field", "prefix": None, "suffix": None}
    args_at = section.find(ARG, name_at)
    if at < name_at:
        position = "pre-func-name"
    elif args_at < 0 or at < args_at:
        position = "between-func-and-args"
    else:
        position = "post-args"
    before, after = section[:at], section[at + len(CALL_ID):]
    prefix = marker_before(section, at) or _clean(before[-20:].split("\n")[-1])
    suffix = marker_after(section, at + len(CALL_ID)) or _clean(after[:20].split("\n")[0])
    return {"position": position, "prefix": _clean(prefix), "suffix": _clean(suffix)}


SENTINELS = (USER, USER2, ASSISTANT, SYSTEM, REASONING, TOOL, TOOL2, ARG, ARG2, VALUE, VALUE2, RESULT, CALL_ID)


def preserved_tokens(caps: dict) -> list[str]:
    """Every non-empty marker the analysis found, trimmed, first occurrence first (llama.cpp's preserved
    tokens: what a parser must keep whole)."""
    tools = caps["tools"]
    found = [caps["reasoning"].get("start"), caps["reasoning"].get("end"),
             caps["content"].get("start"), caps["content"].get("end"),
             tools.get("section_start"), tools.get("section_end"), tools.get("per_call_start"),
             tools.get("per_call_end"), tools["function"].get("name_prefix"), tools["function"].get("name_suffix"),
             tools["function"].get("close"), *(tools["argument_markers"].get(k) for k in
                                               ("start", "end", "name_prefix", "name_suffix", "value_prefix",
                                                "value_suffix")),
             tools["call_id"].get("prefix"), tools["call_id"].get("suffix")]
    tokens = []
    for token in found:
        token = (token or "").strip()
        if token and token not in tokens and not any(s in token for s in SENTINELS):
            tokens.append(token)
    return tokens


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
    calls_render = call["calls"] == "rendered"
    caps["reasoning"].update(reasoning_scope(o["reasoning_content_tools"], o["reasoning_call"],
                                             caps["reasoning"]["start"], caps["reasoning"]["end"]))
    caps["content"] = content_mode(o["content_tools"], o["call_object"] if calls_render else o["call_plain"],
                                   o["reasoning_content_tools"], caps["reasoning"]["end"])
    caps["turns"] = turn_starts(o["user"], o["user_assistant"], o["user_assistant_user"], eot, caps["content"]["start"])
    caps["tools"].update(tool_anatomy(o, {**call, "section": section}, eot, caps["reasoning"]))
    caps["preserved_tokens"] = preserved_tokens(caps)
    # the differentials that could not run: a field read from them is unknown, not an answer
    caps["probes_raised"] = sorted(name for name, outcome in o.items() if isinstance(outcome, Raised))
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
    return encode_record(caps)


def load_capabilities(template_id: str, root: Optional[Path] = None) -> Optional[dict]:
    return load_record(capabilities_path(template_id, root))


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

