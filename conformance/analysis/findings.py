"""What a lint violation means for a model: a defect, an input the template does not take, or its format's design.

A property record (properties.py) lists every violation the same way. A publisher needs to know which ones
break the model, so each violation is put in one class, decided by rendering, never by a table of names:

    violation   breaks the model: the finding stays when the inputs below are left out
    capability  the template does not take an input: the finding comes only from cases that give it; shown
                with those inputs, it does not fail lint. Content parts (a message `content` that is a list of
                `{type, text}` parts, which a text-only template prints as a Python repr or drops; servers such
                as vLLM join text parts into a string first; parts kept only in part are a defect, but a part
                that is the template's own text, a default system prompt, shows nothing kept), and a system or
                developer message after the first message (a template that takes one, at the start).
    design      the format's own choice, learnt from the template's own renders and markers:
                - tool turns: an unclosed turn, stray closer or varying generation prompt found only in cases
                  with tool turns, when the probe `[user, tool call, tool result]` shows the assistant's
                  closer (from the probe `[user, assistant]`) missing between the call and the result (the
                  turn is kept open across tool calls: Gemma 4), or every conversation ending with a tool
                  result gets an empty generation prompt (the model's turn goes on: DeepSeek);
                - an unclosed turn whose next opener follows with only whitespace, or a role's name and a short
                  header text on its line, between, a pair the probes print as one header (one header of two
                  markers: `<|begin|>ROLE<|content|>`), or whose role's probe shows no closer of its own (Falcon
                  3's turns end where the next begins);
                - a stray closer that ends the template's own prose spelling out its marker pair
                  (`format: <tool_call>{...}</tool_call>`);
                - a generation prompt that changes the render only by dropping past assistants' reasoning (the
                  format does not replay reasoning at inference);
                - a rewritten history whose earlier bytes from the break are markers only and the generation
                  prompt's (or an empty reasoning block), or begin with the system message, or with the
                  template's own instruction, that the later prompt still shows further on (Mistral puts the
                  system prompt in the last user message; a thinking instruction moves the same way).

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


def continues_after_tool(cases: list, out: dict, usual: Optional[str] = None) -> bool:
    """Whether the template opens no new turn after a tool result: every conversation ending with a tool
    result gets one generation prompt, empty or without the opener the usual generation prompt starts with
    (the model's turn goes on, as DeepSeek's tool outputs do: V3.2 adds only an empty reasoning block)."""
    opener = next(iter(P._tags(usual or "")), None)
    seen: set = set()
    for case in cases:
        if not P.flippable(case) or P._last_role(case) != "tool":
            continue
        base, flip = P._text(out.get(("base", case.id))), P._text(out.get(("flip", case.id)))
        if base is None or flip is None:
            continue
        if base == flip:
            seen.add("")
        elif opener and base.startswith(flip) and opener not in base[len(flip):]:
            seen.add(base[len(flip):])
        else:
            return False
    return len(seen) == 1


def later_system(case) -> bool:
    """A system or developer message after the conversation's first message."""
    messages = [m for m in case.conversation.messages if isinstance(m, dict)]
    return any(m.get("role") in ("system", "developer") for m in messages[1:])


_OPENED = re.compile(r"opened by '(.+?)' at byte (\d+) is not closed .*? before '(.+?)' opens another at byte (\d+)")


# what may stand between the two markers of one turn header: the role's name, with at most a short header
# text after it, all on the markers' line (`<|begin|>system<|content|>`, `<|im_start|>system name=<|plugin|>`);
# a marker on the next line (`<|im_start|>assistant\n<tool_call>`) opens something inside the turn
_HEADER_TEXT = re.compile(r"[^\S\n]*([A-Za-z_]+)\b[^\n<>]{0,20}")


def _compound_header(finding: dict, out: dict, probes: dict, case=None) -> bool:
    """An unclosed turn whose opener is one marker of a turn header made of two: the next opener follows it
    with nothing but whitespace, or a role's name and a short header text on one line, between
    (`<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>`, `<|begin|>ROLE<|content|>`), or it is itself the second marker
    after one such (`<|im_start|>system name=<|plugin|>`): one header, not two turns. With text between, the two
    markers must differ and the text stays on their line. A message's own text between them is no header: a role
    name inside a message's text does not count. The template's own probes must print the pair as a header."""
    match = _OPENED.search(finding["explanation"][1])
    text = P._text(out.get(("base", finding["case"])))
    if not match or text is None:
        return False
    tag, start, end = match.group(1), int(match.group(2)), int(match.group(4))
    if text[start:start + len(tag)] != tag:
        return False
    if not text[start + len(tag):end].strip():
        return _probes_print_pair(probes, tag, match.group(3))
    if case is None:
        return False
    roles = set(P._ROLES) | {r for r in P._roles(case.conversation) if isinstance(r, str)}
    # a message's text (not a tool's or argument's name, which a header may spell: `name=`)
    said = [m.get(key) for m in case.conversation.messages if isinstance(m, dict)
            for key in ("content", "reasoning_content")]
    spans = P.input_spans(text, [s for s in said if isinstance(s, str) and s.strip()])

    def header(since: int, until: int) -> bool:
        found = _HEADER_TEXT.fullmatch(text[since:until])
        return found is not None and found.group(1) in roles and not any(s < until and e > since for s, e in spans)

    # the two markers of a header differ: one opener, a role's name and the same opener again is a turn
    # left empty and open (`<|im_start|>assistant<|im_start|>user`), not a header
    following = P._TAG.match(text, end)
    if following and following.group() != tag and header(start + len(tag), end) \
            and _probes_print_pair(probes, tag, following.group()):
        return True
    before = list(P._TAG.finditer(text[:start]))
    return bool(before and before[-1].group() != tag and before[-1].end() < start and header(before[-1].end(), start)
                and _probes_print_pair(probes, before[-1].group(), tag))


def _probes_print_pair(probes: dict, first: str, second: str) -> bool:
    """Whether the template's own probe renders print `first` and then `second` as one header: with nothing but
    whitespace, or a role's name and a short header text on their line, between. Two role openers that only a
    case's render puts side by side (Phi-3's `<|assistant|>` printed after every user turn, then the next
    `<|user|>`) are two turns, the first left open."""
    shape = re.compile(re.escape(first) + r"(?:\s*|[^\S\n]*[A-Za-z_]+\b[^\n<>]{0,20})" + re.escape(second))
    return any(shape.search(text) for text in map(P._text, probes.values()) if text)


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


def _assistant_opener(probes: dict) -> Optional[str]:
    """The tag that opens the assistant's turn in the template's [user, assistant] probe."""
    pair, user = P._text(probes.get("user_assistant")), P._around(P._text(probes.get("user")), P.USER)
    if pair is None or P.USER not in pair:
        return None
    since = pair.index(P.USER) + len(P.USER)
    found = P._around(pair, P.ASSISTANT, since)
    return found[0] if found and (not user or found[0] != user[0]) else None


def _closer_opens_next(finding: dict, probes: dict) -> Optional[str]:
    """The assistant's opener when it is what the finding takes for a closer: the template's turns have no
    closer, each ends where the next begins (Apriel's `<|begin_assistant|>`), so that tag closes nothing."""
    opener = _assistant_opener(probes)
    closers = set((finding.get("evidence") or {}).get("closers") or ())
    if not opener or opener not in closers:
        return None
    if finding["kind"] == "stray-closer":
        stray = re.search(r"'(.+?)' at byte", finding["explanation"][1])
        return opener if stray and stray.group(1) == opener else None
    return opener if closers == {opener} else None


def _shared_turn(finding: dict, probes: dict, out: dict) -> Optional[str]:
    """The separator between a system part and a user part of one turn, when a stray closer is the user's:
    in the template's own [system, user] probe the user text follows a tag that closes neither the user's nor
    the assistant's turn and is followed by the stray tag (Hunyuan's `<|startoftext|>S<|extra_4|>U<|extra_0|>`),
    and in the render the stray closer follows that separator the same way."""
    stray = re.search(r"'(.+?)' at byte (\d+)", finding["explanation"][1])
    closers = set((finding.get("evidence") or {}).get("closers") or ())
    if not stray:
        return None
    tag, at = stray.group(1), int(stray.group(2))
    probe = P._around(P._text(probes.get("system_user")), P.USER)
    user = P._around(P._text(probes.get("user")), P.USER)
    pair = P._text(probes.get("user_assistant"))
    assistant = P._around(pair, P.ASSISTANT, pair.index(P.USER) + len(P.USER)) if pair and P.USER in pair else None
    if not probe or probe[1] != tag or probe[0] not in closers or (user and probe[0] == user[1]) \
            or (assistant and probe[0] == assistant[1]):
        return None
    text = P._text(out.get(("base", finding["case"])))
    before = P._tags(text[:at]) if text else []
    return probe[0] if before and before[-1] == probe[0] else None


def _prompt_extras(finding: dict, cases: list, out: dict) -> Optional[str]:
    """The generation prompt's extras when a history rewrite is only those not replayed: the earlier prompt
    (asked for a generation prompt) has only template text from the break on, not blank, and the later prompt
    goes on there with the assistant's answer (a prefill before it: Apriel's `Here are my reasoning steps:`)
    or with the tag the earlier prompt ends on (an instruction turn before the assistant's opener: Command R+'s
    `Write 'Action:' ...`)."""
    evidence = finding.get("evidence") or {}
    earlier = next((c for c in cases if c.id == evidence.get("earlier")), None)
    later = next((c for c in cases if c.id == finding["case"]), None)
    at = evidence.get("offset")
    if earlier is None or later is None or not isinstance(at, int) or not earlier.conversation.add_generation_prompt:
        return None
    a, b = P._text(out.get(("base", earlier.id))), P._text(out.get(("base", later.id)))
    if a is None or b is None or not a[at:].strip():
        return None
    tail, rest = a[at:], b[at:].lstrip()
    if any(P.present(value, tail) for _, value in P.faithfulness_items(earlier.conversation)):
        return None
    answers = [m.get("content") for m in later.conversation.messages[len(earlier.conversation.messages):]
               if isinstance(m, dict) and m.get("role") == "assistant"]
    if answers and isinstance(answers[0], str) and answers[0].strip() and rest.startswith(answers[0].strip()[:40]):
        return tail
    tags = P._tags(tail)
    if tags and tail.rstrip().endswith(tags[-1]) and rest.startswith(tags[-1]) and P._TAG.sub("", tail).strip():
        return tail
    return None


def _not_a_marker(finding: dict, probes: dict, out: dict) -> Optional[str]:
    """A finding's closer that is text, not a turn marker: everywhere the probes and the render print it, it
    is glued to a word that is not a probe's sentinel (a type written `List[str]` in tool declarations)."""
    closers = sorted((finding.get("evidence") or {}).get("closers") or ())
    texts = [P._text(p) for p in probes.values()] + [P._text(out.get(("base", finding["case"])))]
    texts = [t for t in texts if t]
    if not closers:
        return None
    for closer in closers:
        spots = [t[:i] for t in texts for i in (m.start() for m in re.finditer(re.escape(closer), t))]
        if not spots or not all(re.search(r"\w$", before) and not before.endswith(P.SENTINELS) for before in spots):
            return None
    return " ".join(closers)


def _closer_in_prose(finding: dict, template: str, out: dict) -> Optional[str]:
    """A stray closer that is the end of the template's own prose spelling out a marker pair: on one line of the
    template's text, an opener of the finding's group right after a word (`format: <tool_call>`, text by the
    prose rule) and later the closer (`...}</tool_call>`), and the render prints that stretch of text whole,
    ending at the stray closer. The prose rule pairs a closer with its opener only right after it."""
    stray = re.search(r"'(.+?)' at byte (\d+)", finding["explanation"][1])
    openers = set((finding.get("evidence") or {}).get("openers") or ())
    text = P._text(out.get(("base", finding["case"])))
    if not stray or text is None:
        return None
    closer, end = stray.group(1), int(stray.group(2)) + len(stray.group(1))
    for line in P.template_literals(template).split("\n"):
        for tag in P._TAG.finditer(line):
            if tag.group() not in openers or not P._WORD_BEFORE.search(line[:tag.start()]):
                continue
            stop = line.find(closer, tag.end())
            stretch = line[tag.start():stop + len(closer)] if stop >= 0 else ""
            if stretch and text[max(0, end - len(stretch)):end] == stretch:
                return P._WORD_BEFORE.search(line[:tag.start()]).group().lstrip() + stretch
    return None


def _parts_partly_kept(finding: dict, cases: list, out: dict, template: str) -> bool:
    """Whether a message's content parts reach the prompt only in part: the template takes parts (another text
    part of the same message is there) and loses one, a defect rather than an input it does not take. A part
    that is also the template's own text (a default system prompt put in place of content it does not take)
    proves nothing: finding it is no sign that the part reached the prompt."""
    evidence = finding.get("evidence") or {}
    case = next((c for c in cases if c.id == finding["case"]), None)
    text = P._text(out.get(("base", finding["case"])))
    missing = evidence.get("missing")
    if case is None or text is None or not isinstance(missing, str):
        return False
    own = P.template_literals(template)
    for message in case.conversation.messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            texts = P._part_texts(content)
            kept = [t for t in texts if t[:200] != missing and P.present(t, text)]
            if any(t[:200] == missing for t in texts) and any(not P.present(t, own) for t in kept):
                return True
    return False


def _rewrite_design(finding: dict, cases: list, out: dict, template: str) -> Optional[str]:
    """Why a history rewrite is the format's design, from the renders: the earlier prompt's bytes from the
    break on are markers only (its generation prompt's prefill, not replayed), or they begin with the
    conversation's system message, which the later prompt still shows further on (the format puts the system
    message with the last user message), or with the template's own instruction, moved the same way."""
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
    instruction = _moving_instruction(template, earlier, a, b, at)
    if instruction:
        return (f"the format puts its own instruction ({instruction[:60]!r}) with the last user message, so it "
                f"moves as the conversation grows")
    return None


def _moving_instruction(template: str, earlier, a: str, b: str, at: int) -> Optional[str]:
    """The template's own text that a history rewrite moves on: the earlier prompt's bytes from the break begin
    with template text, not input (words, not only markers), up to the next input text; the later prompt goes
    on at the break with that input text and shows the template text again further on (an instruction the
    format prints before the last user message: a thinking instruction)."""
    spans = [span for span in P.input_spans(a, P.input_strings(earlier.conversation)) if span[1] > at]
    if not spans or spans[0][0] <= at:
        return None
    own, follows = a[at:spans[0][0]], a[spans[0][0]:spans[0][1]]
    if len(P._TAG.sub("", own).strip()) < 20 or not P.present(own, P.template_literals(template)):
        return None
    if b[at:].lstrip().startswith(follows.strip()[:40]) and b.find(own.strip(), at + 1) > at:
        return own.strip()
    return None


def drops_reasoning_for_prompt(case, out: dict) -> bool:
    """Whether the generation prompt changes the render only by dropping past assistants' reasoning: the render
    without it shows reasoning the render with it no longer shows, and nothing else of the input differs (the
    format replays reasoning for training, not at inference: `if add_generation_prompt ... split('</think>')`)."""
    if not P.flippable(case):
        return False
    base, flip = P._text(out.get(("base", case.id))), P._text(out.get(("flip", case.id)))
    if base is None or flip is None:
        return False
    on, off = (base, flip) if case.conversation.add_generation_prompt else (flip, base)
    return not on.startswith(off) and P._reasoning_dropped(off, on, case.conversation)


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
    by_id = {c.id: c for c in cases}
    first_system = [c for c in plain if not later_system(c)]
    quiet = [c for c in cases if not has_tool_turns(c)]
    replayed = [c for c in cases if not drops_reasoning_for_prompt(c, out)]
    probes = _probes(out)
    usual = record["generation_prompts"].get("{}")
    derived: dict = {}
    tool_design: list = []

    def again(name: str, subset: str) -> dict:
        """The property re-derived on a subset of the cases, from the same renders."""
        if (name, subset) not in derived:
            chosen = {"plain": plain, "first-system": first_system, "quiet": quiet, "replayed": replayed}[subset]
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
            elif continues_after_tool(cases, out, usual):
                tool_design.append("tool turns: after a tool result the template opens no new turn (an empty "
                                   "generation prompt, or one that opens no turn); the model's turn goes on")
            else:
                tool_design.append("")
        return tool_design[0] or None

    found = []
    for name in P.PROPERTY_IDS:
        for finding in record["properties"][name]["violations"]:
            cls, inputs, shown, partly = "violation", None, finding, False
            kind = finding["kind"]
            if name in ("no-repr-leak", "faithfulness") and len(plain) < len(cases):
                remaining = again(name, "plain").get(kind)
                # a template that takes parts and keeps only some of them: a defect, whatever else it takes
                partly = name == "faithfulness" and _parts_partly_kept(finding, cases, out, template)
                if remaining is None and not partly:
                    cls, inputs = "capability", PARTS_INPUTS
                elif remaining is not None:
                    shown = remaining
            if cls == "violation" and not partly and name == "faithfulness" and kind in ("drops-content:system",
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
            if name == "generation-prompt" and kind == "not-an-append" and len(replayed) < len(cases):
                remaining = again(name, "replayed").get(kind)
                if remaining is None:
                    cls, inputs = "design", ("past assistants' reasoning: the template drops it only when a "
                                             "generation prompt is asked for (replayed for training, not at "
                                             "inference); nothing else the generation prompt changes")
                else:
                    shown = remaining
            if cls == "violation" and name == "marker-balance" and shown["kind"] in ("unclosed-turn", "stray-closer"):
                opener = _closer_opens_next(shown, probes)
                text = _not_a_marker(shown, probes, out)
                separator = _shared_turn(shown, probes, out) if shown["kind"] == "stray-closer" else None
                prose = _closer_in_prose(shown, template, out) if shown["kind"] == "stray-closer" else None
                if prose:
                    cls, inputs = "design", (f"the template's own text spells the marker pair out ({prose[:80]!r}): "
                                             f"text, not a turn")
                elif text:
                    cls, inputs = "design", (f"not a turn marker: {text} is glued to a word wherever the template "
                                             f"prints it (text such as a type `List[str]`)")
                elif opener:
                    cls, inputs = "design", (f"turns end where the next begins: {opener} opens the assistant's turn "
                                             f"(learnt from its [user, assistant] probe), it closes nothing")
                elif separator:
                    cls, inputs = "design", (f"a system part and the user part after it share one turn, {separator} "
                                             f"between them (learnt from its [system, user] probe)")
            if cls == "violation" and name == "marker-balance" and shown["kind"] == "unclosed-turn":
                role = _no_closer_of_its_own(shown, probes)
                if _compound_header(shown, out, probes, by_id.get(shown["case"])):
                    cls, inputs = "design", ("the template's turn header is two markers, with at most the role's "
                                             "name and a short header text between them: one turn")
                elif role:
                    cls, inputs = "design", (f"{role} turns: the template ends them where the next turn begins "
                                             f"(no closer of their own, learnt from its {role} probe)")
            if cls == "violation" and name == "prefix-stability":
                extras = _prompt_extras(shown, cases, out)
                why = _rewrite_design(shown, cases, out, template) or (extras and (
                    f"the generation prompt's extras ({extras[:60]!r}) are not replayed with the answer"))
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
