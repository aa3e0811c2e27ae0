"""What a lint violation means for a model: a defect, an input the template does not take, or its format's design.

A property record (properties.py) lists every violation the same way. A publisher needs to know which ones
break the model, so each violation is put in one class, decided by rendering, never by a table of names:

    violation   breaks the model: the finding stays when the inputs below are left out
    capability  the template does not take an input: the finding comes only from cases that give it; shown
                with those inputs, it does not fail lint. Content parts (a message `content` that is a list of
                `{type, text}` parts, which a text-only template prints as a Python repr or drops; servers such
                as vLLM join text parts into a string first), and a system or developer message after the
                first message (a template that takes one, at the start).
    design      the format's own choice, learnt from the template's own renders and markers:
                - tool turns: an unclosed turn, stray closer or varying generation prompt found only in cases
                  with tool turns, when the probe `[user, tool call, tool result]` shows the assistant's
                  closer (from the probe `[user, assistant]`) missing between the call and the result (the
                  turn is kept open across tool calls: Gemma 4), or every conversation ending with a tool
                  result gets an empty generation prompt (the model's turn goes on: DeepSeek);
                - an unclosed turn whose next opener follows with only whitespace between (one header of two
                  markers), or whose role's probe shows no closer of its own (Falcon 3's turns end where the
                  next begins);
                - a rewritten history whose earlier bytes from the break are markers only and the generation
                  prompt's (or an empty reasoning block), or begin with the system message the later prompt
                  still shows further on (Mistral puts the system prompt in the last user message).

The split re-derives the property on case subsets from the same renders (no new render), so it costs nothing
over `lint` itself. The stored property records are unchanged. Measured against hand labels in labels.py.
"""
from __future__ import annotations

import re
from typing import Optional

from conformance.analysis import properties as P
from runners.base import Rendered

CLASSES = ("violation", "capability", "design")
PARTS_INPUTS = ("content parts: a message `content` given as a list of {type, text} parts (a text-only template "
                "prints or drops them; servers that join text parts into a string first are not affected)")


def has_parts(case) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in case.conversation.messages)


def has_tool_turns(case) -> bool:
    return any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
               for m in case.conversation.messages)


def _probes(out: dict) -> dict:
    probes = {name: out.get(("probe", name)) for name in P.PROBES}
    if not isinstance(probes["user"], Rendered):
        probes.update({name: probes[f"{name}+tools"] for name in P.PROBES if f"{name}+tools" in P.PROBES})
    return probes


def turn_kept_open(probes: dict) -> Optional[dict]:
    """The assistant's opener and closer when the template keeps the assistant's turn open across a tool call
    (its closer does not come between the call and the tool result), from the probe renders; else None."""
    pair = P._text(probes.get("user_assistant"))
    tool = P._text(probes.get("tool"))
    if pair is None or tool is None or P.USER not in pair or P.RESULT not in tool or P.USER not in tool:
        return None
    user = P._around(P._text(probes.get("user")), P.USER)
    since = pair.index(P.USER) + len(P.USER)
    if user and user[1] and user[1] in pair[since:]:
        since = pair.index(user[1], since) + len(user[1])
    found = P._around(pair, P.ASSISTANT, since)
    if not found or not found[0] or not found[1]:
        return None
    opener, closer = found
    after_user = tool.index(P.USER) + len(P.USER)
    call = tool.find(P.TOOL, after_user)
    result = tool.index(P.RESULT)
    if call < 0 or call > result or opener not in tool[after_user:call]:
        return None
    if closer in tool[call:result]:
        return None
    return {"opener": opener, "closer": closer}


def continues_after_tool(cases: list, out: dict) -> bool:
    """Whether the template opens no new turn after a tool result: every conversation ending with a tool
    result gets an empty generation prompt (the model's turn goes on, as DeepSeek's tool outputs do)."""
    seen = False
    for case in cases:
        if not P.flippable(case) or P._last_role(case) != "tool":
            continue
        base, flip = P._text(out.get(("base", case.id))), P._text(out.get(("flip", case.id)))
        if base is None or flip is None:
            continue
        if base != flip:
            return False
        seen = True
    return seen


def later_system(case) -> bool:
    """A system or developer message after the conversation's first message."""
    messages = [m for m in case.conversation.messages if isinstance(m, dict)]
    return any(m.get("role") in ("system", "developer") for m in messages[1:])


_OPENED = re.compile(r"opened by '(.+?)' at byte (\d+) is not closed .*? before '(.+?)' opens another at byte (\d+)")


def _compound_header(finding: dict, out: dict) -> bool:
    """An unclosed turn whose next opener follows it with nothing but whitespace between: one turn header
    made of two markers (`<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>`), not two turns."""
    match = _OPENED.search(finding["explanation"][1])
    text = P._text(out.get(("base", finding["case"])))
    if not match or text is None:
        return False
    tag, start, end = match.group(1), int(match.group(2)), int(match.group(4))
    return text[start:start + len(tag)] == tag and not text[start + len(tag):end].strip()


def _no_closer_of_its_own(finding: dict, probes: dict) -> Optional[str]:
    """The role whose turns the template ends where the next turn begins: the unclosed opener is that role's,
    and in its own probe the first tag after its text is no closer of the finding's group."""
    match = _OPENED.search(finding["explanation"][1])
    closers = set((finding.get("evidence") or {}).get("closers") or ())
    if not match:
        return None
    for role, probe, sentinel in (("system", "system_user", P.SYSTEM), ("user", "user", P.USER)):
        found = P._around(P._text(probes.get(probe)), sentinel)
        if found and found[0] == match.group(1) and found[1] not in closers:
            return role
    return None


def _rewrite_design(finding: dict, cases: list, out: dict) -> Optional[str]:
    """Why a history rewrite is the format's design, from the renders: the earlier prompt's bytes from the
    break on are markers only (its generation prompt's prefill, not replayed), or they begin with the
    conversation's system message, which the later prompt still shows further on (the format puts the system
    message with the last user message)."""
    evidence = finding.get("evidence") or {}
    earlier = next((c for c in cases if c.id == evidence.get("earlier")), None)
    later = next((c for c in cases if c.id == finding["case"]), None)
    if earlier is None or later is None:
        return None
    a, b = P._text(out.get(("base", earlier.id))), P._text(out.get(("base", later.id)))
    at = evidence.get("offset")
    if a is None or b is None or not isinstance(at, int):
        return None
    tail = a[at:]
    if earlier.conversation.add_generation_prompt and tail.strip() and not P._TAG.sub("", tail).strip():
        flip = P._text(out.get(("flip", earlier.id)))
        in_prompt = flip is not None and flip != a and a.startswith(flip) and at >= len(flip)
        reasoning = any(P._REASONING_TAG.search(tag) for tag in P._TAG.findall(tail))
        if in_prompt or reasoning:
            return (f"the prompt's trailing markers {tail!r} (the assistant turn's prefill"
                    f"{', an empty reasoning block' if reasoning else ''}) are not replayed with the answer")
    for message in earlier.conversation.messages:
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "system" else None
        if isinstance(content, str) and content.strip() and tail.lstrip().startswith(content.strip()[:40]) \
                and b.find(content.strip(), at + 1) > at:
            return "the format puts the system message with the last user message, so it moves as the conversation grows"
    return None


def _kinds(prop_record: dict) -> dict:
    return {f["kind"]: f for f in prop_record["violations"]}


def locate(template: str, name: str, finding: dict) -> Optional[int]:
    """The template line a finding points at, where one can be told: the template text printed right before
    (or at) the offending bytes; a generation-prompt finding, the line that reads add_generation_prompt."""
    if name == "generation-prompt":
        match = re.search(r"\badd_generation_prompt\b", template)
        return template.count("\n", 0, match.start()) + 1 if match else None
    evidence = finding.get("evidence") or {}
    text, offset = evidence.get("text"), evidence.get("offset")
    if not isinstance(text, str) or not isinstance(offset, int):
        return None
    at = min(P.SNIPPET, offset)
    # the template text printed just before: the offending bytes may start a little earlier (a list's `[`)
    for end in range(at, max(0, at - 12), -1):
        for piece in (text[max(0, end - k):end] for k in range(40, 3, -1)):
            spot = template.rfind(piece) if piece.strip() else -1
            if spot >= 0:
                return template.count("\n", 0, spot) + 1
    for piece in (text[at:at + k] for k in range(40, 3, -1)):
        spot = template.find(piece) if piece.strip() else -1
        if spot >= 0:
            return template.count("\n", 0, spot) + 1
    return None


def classify(template: str, cases: list, out: dict, record: dict) -> list:
    """Every violation of a property record, with its class, the inputs that hit it (capability, design) and
    the template line it points at (or None)."""
    plain = [c for c in cases if not has_parts(c)]
    first_system = [c for c in plain if not later_system(c)]
    quiet = [c for c in cases if not has_tool_turns(c)]
    probes = _probes(out)
    usual = record["generation_prompts"].get("{}")
    derived: dict = {}
    tool_design: list = []

    def again(name: str, subset: str) -> dict:
        """The property re-derived on a subset of the cases, from the same renders."""
        if (name, subset) not in derived:
            chosen = {"plain": plain, "first-system": first_system, "quiet": quiet}[subset]
            if name == "no-repr-leak":
                derived[name, subset] = P.no_repr_leak(template, chosen, out).record()
            elif name == "faithfulness":
                derived[name, subset] = P.faithfulness(template, chosen, out).record()
            elif name == "marker-balance":
                derived[name, subset] = P.marker_balance(template, chosen, out, probes, usual).record()
            else:
                derived[name, subset] = P.generation_prompt(chosen, out)[0].record()
        return _kinds(derived[name, subset])

    def design_of_tools() -> Optional[str]:
        if not tool_design:
            kept = turn_kept_open(probes)
            if kept:
                tool_design.append(f"tool turns: the template keeps the assistant's turn ({kept['opener']} ... "
                                   f"{kept['closer']}) open across tool calls and their results")
            elif continues_after_tool(cases, out):
                tool_design.append("tool turns: after a tool result the template opens no new turn (an empty "
                                   "generation prompt); the model's turn goes on")
            else:
                tool_design.append("")
        return tool_design[0] or None

    found = []
    for name in P.PROPERTY_IDS:
        for finding in record["properties"][name]["violations"]:
            cls, inputs, shown = "violation", None, finding
            kind = finding["kind"]
            if name in ("no-repr-leak", "faithfulness") and len(plain) < len(cases):
                remaining = again(name, "plain").get(kind)
                if remaining is None:
                    cls, inputs = "capability", PARTS_INPUTS
                else:
                    shown = remaining
            if cls == "violation" and name == "faithfulness" and kind in ("drops-content:system",
                                                                          "drops-content:developer"):
                remaining = again(name, "first-system").get(kind)
                if remaining is None:
                    cls, inputs = "capability", ("a system or developer message after the first message (the "
                                                 "template takes one, at the start)")
                else:
                    shown = remaining
            if name in ("marker-balance", "generation-prompt") and kind in ("unclosed-turn", "stray-closer",
                                                                            "suffix-varies"):
                remaining = again(name, "quiet").get(kind)
                why = design_of_tools() if remaining is None else None
                if why:
                    cls, inputs = "design", why
                elif remaining is not None:
                    shown = remaining
            if cls == "violation" and name == "marker-balance" and shown["kind"] == "unclosed-turn":
                role = _no_closer_of_its_own(shown, probes)
                if _compound_header(shown, out):
                    cls, inputs = "design", "the template's turn header is two markers in a row, one turn"
                elif role:
                    cls, inputs = "design", (f"{role} turns: the template ends them where the next turn begins "
                                             f"(no closer of their own, learnt from its {role} probe)")
            if cls == "violation" and name == "prefix-stability":
                why = _rewrite_design(shown, cases, out)
                if why:
                    cls, inputs = "design", why
            entry = {"property": name, **shown, "class": cls, "line": locate(template, name, shown)}
            if inputs:
                entry["inputs"] = inputs
            found.append(entry)
    return found


def lint_templates(templates: list, workers: int = 2) -> tuple[dict, dict]:
    """(template id -> property record, template id -> classified findings) through the reference; a
    ValueError naming the template when the reference itself fails (nothing can be said about it)."""
    from runners import REFERENCE_RUNNER, get_runner

    findings: dict = {}

    def each(entry, source, cases, out, record) -> None:
        findings[entry.id] = classify(source, cases, out, record)

    runner = get_runner(REFERENCE_RUNNER, workers=workers)
    try:
        results, failures = P.compute_properties(templates, runner, each=each)
    finally:
        runner.close()
    if failures:
        raise ValueError("; ".join(f"{template_id}: the reference failed: {message}" for template_id, message in failures))
    return results, findings
