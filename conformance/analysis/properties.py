"""Golden-free properties: is a template sound on its own, judged through the reference's own renders.

Goldens say whether an engine reproduces the reference; they cannot say whether the template is sound. These
properties need no golden: each compares renders of the same template through the reference (transformers,
out of process, batched through `render_many`) with one input changed.

    prefix-stability   the prompt of step k of a step-by-step case (`sequence`) is a byte prefix of step k+1's
    generation-prompt  render(add_generation_prompt=True) == render(False) + suffix, one suffix per kwargs
    marker-balance     every turn marker opened is closed (markers learnt from probe renders of the template)
    no-repr-leak       no Python repr (`{'`, `None`, `True`) or HTML escape (`\\u003c`, `&lt;`) the input lacks
    time-invariance    two clocks give the same bytes, unless the template prints the clock's date
    determinism        two renders of the same input give the same bytes
    faithfulness       every message content, tool name, parameter and call argument appears, unless the
                       template never renders that kind of input (reported as dropped, not as a violation)

Every case of conformance/cases is rendered as is (`base`), again (`again`), with the clock moved (`clock`)
and with the generation prompt flipped (`flip`, when the case ends with a user or tool turn); four probe
conversations with sentinel contents teach marker-balance the template's turn markers. A violation names
its minimal case (the case with the fewest messages, then the shortest input) and the evidence (offsets,
snippets). Known, intended exceptions (reasoning dropped from past turns, a generation prompt's prefill not
replayed) are classified and counted apart, never hidden.

Results per template are analysis goldens: goldens/<template-id>/properties.json (`chatgold properties
update`); the gate re-derives them. A reference failure (Errored/Skipped, never a template refusal) makes
the template a failure: no record is written and the old one is kept.
"""
from __future__ import annotations

import bisect
import datetime as _dt
import difflib
import json
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.analysis.capabilities import (
    ARG,
    ASSISTANT,
    CALL_ID,
    RESULT,
    SYSTEM,
    TOOL,
    TOOLS,
    USER,
    VALUE,
    _back_off_open_tag,
    _call,
)
from conformance.analysis.capabilities import (
    common_prefix_length as first_difference,
)
from conformance.files import ENCODING_ERRORS, atomic_write
from conformance.judge.goldens import (
    PROPERTIES_FILE,
    encode_record,
    goldens_dir,
    load_record,
)
from runners.base import Errored, Outcome, Raised, Rendered, RenderRequest, Skipped

FORMAT_VERSION = 1

PROPERTY_IDS = ("prefix-stability", "generation-prompt", "marker-balance", "no-repr-leak", "time-invariance",
                "determinism", "faithfulness")

# First line of every violation's explanation: what the property demands.
DEMANDS = {
    "prefix-stability": "The prompt of one step of a conversation must be a byte prefix of the next step's prompt.",
    "generation-prompt": "render(add_generation_prompt=True) must equal render(False) plus one suffix, the same "
                         "for every conversation.",
    "marker-balance": "Every turn the template opens must be closed before the next one opens.",
    "no-repr-leak": "JSON input must reach the prompt as JSON, never as a Python repr or HTML-escaped.",
    "time-invariance": "Moving the clock may change only the date and time the template prints.",
    "determinism": "Two renders of the same input must give the same bytes.",
    "faithfulness": "Every message content, tool name, parameter and call argument must reach the prompt.",
}

STATUSES = ("pass", "violation", "exception", "not-applicable")
SNIPPET = 60         # characters of context each side of an offset in evidence
MAX_CASES = 10       # case ids listed per violation kind
CLOCK_SHIFT = _dt.timedelta(days=400, hours=7, minutes=13)  # a different year, month, day, weekday, hour, minute

# Probe conversations with sentinel contents: where a sentinel lands tells which tags open and close a turn.
_PROBE_TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [_call(TOOL, CALL_ID)]}
PROBES: dict[str, tuple] = {
    "user": ([{"role": "user", "content": USER}], None),
    "system_user": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], None),
    "user_assistant": ([{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}], None),
    "tool": ([{"role": "user", "content": USER}, _PROBE_TOOL_CALL,
              {"role": "tool", "tool_call_id": CALL_ID, "name": TOOL, "content": RESULT}], TOOLS),
}
# The same with tools, for templates that refuse to render without them (Hermes 2 Pro tool_use).
PROBES.update({f"{name}+tools": (messages, TOOLS) for name, (messages, tools) in list(PROBES.items()) if tools is None})
SENTINELS = (USER, SYSTEM, ASSISTANT, RESULT, VALUE, TOOL, CALL_ID, ARG)

_TAG = re.compile(r"<[^<>\n]{1,64}>|\[[^\[\]\n]{1,64}\]")


# --- requests -------------------------------------------------------------------------------------------------

def shifted_now(now: str) -> str:
    return (_dt.datetime.fromisoformat(now) + CLOCK_SHIFT).isoformat()


def _last_role(case) -> Optional[str]:
    messages = case.conversation.messages
    return messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None


def flippable(case) -> bool:
    """A case whose generation prompt is meaningful: it ends with a user or tool turn and is not continued."""
    return not case.conversation.continue_final_message and _last_role(case) in ("user", "tool")


def property_requests(template: str, bos_token: Optional[str], eos_token: Optional[str], cases: list,
                      template_id: Optional[str] = None) -> list[tuple[tuple, RenderRequest]]:
    """Every render the properties need for one template: ((kind, name), request), kinds base/again/clock/
    flip (name: the case id) and probe (name: the probe)."""
    out = []
    for case in cases:
        for kind, conv in _variants(case):
            out.append(((kind, case.id), RenderRequest(template, conv, bos_token, eos_token, template_id,
                                                       f"properties:{kind}:{case.id}")))
    for name, conv in _probe_conversations():
        out.append((("probe", name), RenderRequest(template, conv, bos_token, eos_token, template_id,
                                                   f"properties:probe:{name}")))
    return out


# A case's variants and the probes are the same for every template: made once, so the result store's key of
# each conversation is computed once too (its memo goes by the conversation object).
_VARIANTS: dict = {}


def _variants(case) -> list:
    found = _VARIANTS.get(id(case))
    if found is not None and found[0] is case:  # the entry holds its case: the id is not reused meanwhile
        return found[1]
    conversation = case.conversation
    variants = [("base", conversation), ("again", conversation),
                ("clock", replace(conversation, now=shifted_now(conversation.now)))]
    if flippable(case):
        variants.append(("flip", replace(conversation, add_generation_prompt=not conversation.add_generation_prompt)))
    if len(_VARIANTS) > 10_000:
        _VARIANTS.clear()
    _VARIANTS[id(case)] = (case, variants)
    return variants


@lru_cache(maxsize=1)
def _probe_conversations() -> tuple:
    return tuple((name, RenderRequest.make("", messages, tools=tools).conversation)
                 for name, (messages, tools) in PROBES.items())


# --- helpers --------------------------------------------------------------------------------------------------

def _text(outcome: Optional[Outcome]) -> Optional[str]:
    return outcome.text if isinstance(outcome, Rendered) else None


def snippet(text: str, at: int, width: int = SNIPPET) -> str:
    return text[max(0, at - width):at + width]


def input_strings(conversation) -> list[str]:
    """Every string value of the conversation's input (messages, tools, documents, kwargs), longest first."""
    found: set = set()

    def walk(value) -> None:
        if isinstance(value, str):
            if value:
                found.add(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                found.add(str(key))
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(conversation.messages)
    walk(conversation.tools)
    walk(conversation.documents)
    walk(dict(conversation.kwargs))
    return sorted(found, key=len, reverse=True)


def input_spans(text: str, strings: Iterable[str]) -> list[tuple[int, int]]:
    """Where the input's own strings (and their JSON-escaped forms) sit in a render, merged."""
    spans = []
    for value in strings:
        if len(value) < 2:
            continue
        for form in _forms(value):
            start = text.find(form)
            while start >= 0:
                spans.append((start, start + len(form)))
                start = text.find(form, start + 1)
    spans.sort()
    merged: list = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(span) for span in merged]


@lru_cache(maxsize=4096)
def _forms(value: str) -> frozenset:
    """A string as a render may show it: as is, JSON-escaped, JSON-escaped to ASCII."""
    return frozenset((value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]))


def _inside(spans: list, start: int, end: int) -> bool:
    """Whether [start, end) lies within one of the merged, sorted spans."""
    at = bisect.bisect_right(spans, (start, float("inf"))) - 1
    return at >= 0 and spans[at][1] >= end


def case_size(case) -> tuple:
    """Smaller is more minimal: fewer messages, then less input."""
    conversation = case.conversation
    return (len(conversation.messages), len(json.dumps(conversation.to_dict(), ensure_ascii=False)), case.id)


class _Finding:
    """Violations or exceptions of one kind for one property, collected over cases."""

    def __init__(self, kind: str, detail: str, case, evidence: dict):
        self.kind = kind
        self.cases = {case.id: case}
        self.best = (case, detail, evidence)

    def add(self, detail: str, case, evidence: dict) -> None:
        if case_size(case) < case_size(self.best[0]):
            self.best = (case, detail, evidence)
        self.cases[case.id] = case

    def record(self, prop: str) -> dict:
        case, detail, evidence = self.best
        listed = sorted(c for c in self.cases if c != case.id)[:MAX_CASES - 1]
        return {"kind": self.kind, "explanation": [DEMANDS[prop], detail],
                "case": case.id, "count": len(self.cases), "cases": sorted([case.id, *listed]), "evidence": evidence}


class _Property:
    def __init__(self, prop: str):
        self.prop = prop
        self.checked = 0
        self.violations: dict[str, _Finding] = {}
        self.exceptions: dict[str, _Finding] = {}
        self.note: Optional[str] = None

    def _add(self, table: dict, kind: str, detail, case, evidence) -> None:
        if kind in table:
            table[kind].add(detail, case, evidence)
        else:
            table[kind] = _Finding(kind, detail, case, evidence)

    def violation(self, kind: str, detail, case, evidence: dict) -> None:
        self._add(self.violations, kind, detail, case, evidence)

    def exception(self, kind: str, detail, case, evidence: dict) -> None:
        self._add(self.exceptions, kind, detail, case, evidence)

    def record(self) -> dict:
        if self.violations:
            status = "violation"
        elif self.exceptions:
            status = "exception"
        elif self.checked:
            status = "pass"
        else:
            status = "not-applicable"
        result = {"status": status, "checked": self.checked,
                  "violations": [f.record(self.prop) for _, f in sorted(self.violations.items())],
                  "exceptions": [f.record(self.prop) for _, f in sorted(self.exceptions.items())]}
        if self.note:
            result["note"] = self.note
        return result


# --- prefix stability -----------------------------------------------------------------------------------------

_REASONING_TAG = re.compile(r"think|reason|thought", re.IGNORECASE)


def _sequences(cases: list) -> list[list]:
    groups: dict = {}
    for case in cases:
        if case.sequence:
            groups.setdefault(case.sequence["name"], []).append(case)
    return [sorted(steps, key=lambda c: c.sequence["step"]) for _, steps in sorted(groups.items())]


def _reasoning_texts(conversation) -> list[str]:
    texts = []
    for message in conversation.messages:
        if not isinstance(message, dict):
            continue
        for key in ("reasoning_content", "reasoning", "thinking"):
            if isinstance(message.get(key), str) and message[key].strip():
                texts.append(message[key])
        content = message.get("content")
        if isinstance(content, str) and "</think>" in content:
            texts.append(content.split("</think>")[0].split("<think>")[-1])
    return texts


def _overlaps(spans: list, start: int, end: int) -> bool:
    return any(s < end and start < e for s, e in spans)


def _reasoning_dropped(history: str, later: str, conversation) -> bool:
    """Whether all the later prompt no longer shows of the earlier history is reasoning: with the
    conversation's reasoning texts taken out of the history, what still differs is template markup (tags,
    channel names, whitespace), never other input text."""
    reasoning = {r.strip() for r in _reasoning_texts(conversation) if r.strip()}
    shown = [r for r in reasoning if r in history]
    if not shown:
        return False
    stripped = history
    for value in sorted(shown, key=len, reverse=True):
        stripped = stripped.replace(value, "")
    strings = [text.strip() for _, text in faithfulness_items(conversation) if text.strip() not in reasoning]
    history_spans, later_spans = input_spans(stripped, strings), input_spans(later, strings)
    # the shared start needs no diff; the later prompt is cut to about what can align with the rest
    p = first_difference(stripped, later)
    rest = len(stripped) - p
    matcher = difflib.SequenceMatcher(None, stripped[p:], later[p:p + 2 * rest + 200], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        i1, i2, j1, j2 = i1 + p, i2 + p, j1 + p, j2 + p
        if tag == "equal" or i1 >= len(stripped):
            continue
        if _overlaps(history_spans, i1, i2) or (i2 < len(stripped) and _overlaps(later_spans, j1, j2)):
            return False
    return True


def _marker_only(text: str) -> bool:
    """A prefill the history may drop: tags and whitespace only, a reasoning tag (`<think>\n`), or tags around
    a reasoning channel's name (Gemma 4's `<|channel>thought\n<channel|>`)."""
    rest = _TAG.sub("", text).strip()
    return any(_REASONING_TAG.search(tag) for tag in _TAG.findall(text)) or not rest or \
        bool(_REASONING_TAG.fullmatch(rest))


def prefix_stability(cases: list, out: dict) -> _Property:
    """Step k's prompt must be a prefix of step k+1's. Intended exceptions: the break lies inside step k's
    generation prompt (its prefill, e.g. `<think>\n`, is not replayed with the answer), or all that step k+1
    no longer shows is reasoning (reasoning dropped from past turns; compared without whitespace)."""
    prop = _Property("prefix-stability")
    for steps in _sequences(cases):
        for earlier, later in zip(steps, steps[1:]):
            a, b = _text(out.get(("base", earlier.id))), _text(out.get(("base", later.id)))
            if a is None or b is None:
                continue
            prop.checked += 1
            if b.startswith(a):
                continue
            at = _back_off_open_tag(a, first_difference(a, b))  # a tag is kept whole: `<think>`, not `think>`
            evidence = {"offset": at, "earlier": earlier.id, "earlier_text": snippet(a, at),
                        "later_text": snippet(b, at)}
            without_prompt = _text(out.get(("flip", earlier.id)))
            prompt_at = len(without_prompt) if without_prompt is not None and a.startswith(without_prompt) and \
                earlier.conversation.add_generation_prompt else None
            history = a[:prompt_at] if prompt_at is not None else a
            if prompt_at is not None and at >= prompt_at and _marker_only(a[at:]):
                prop.exception("prefill-not-replayed",
                               f"{later.id} replays the answer to {earlier.id} without {a[at:]!r}, the end of "
                               f"the generation prompt {a[prompt_at:]!r} (the prefill is not kept in the history).",
                               later, {**evidence, "generation_prompt": a[prompt_at:], "dropped": a[at:]})
            elif _reasoning_dropped(history, b, earlier.conversation):
                prop.exception("reasoning-dropped",
                               f"{later.id} no longer shows the reasoning {earlier.id}'s prompt showed from byte "
                               f"{at} ({a[at:at + 40]!r}): reasoning dropped from past turns.", later, evidence)
            else:
                prop.violation("history-rewritten",
                               f"{later.id} rewrites {earlier.id}'s prompt from byte {at}: "
                               f"{a[at:at + 40]!r} became {b[at:at + 40]!r}.", later, evidence)
    return prop


# --- generation prompt ----------------------------------------------------------------------------------------

def _kwargs_key(case) -> str:
    return json.dumps(dict(case.conversation.kwargs), sort_keys=True, ensure_ascii=False)


def generation_prompt(cases: list, out: dict) -> tuple[_Property, dict]:
    """The property, and the suffix per kwargs group (the most common one)."""
    prop = _Property("generation-prompt")
    suffixes: dict = {}
    for case in cases:
        if not flippable(case):
            continue
        base, flip = out.get(("base", case.id)), out.get(("flip", case.id))
        on, off = (base, flip) if case.conversation.add_generation_prompt else (flip, base)
        if isinstance(on, Raised) and isinstance(off, Raised):
            continue
        prop.checked += 1
        if isinstance(on, Raised) or isinstance(off, Raised):
            side = "with" if isinstance(on, Raised) else "without"
            refusal = on if isinstance(on, Raised) else off
            prop.violation("raises-on-one-side", f"{case.id} renders only {'without' if side == 'with' else 'with'} "
                           f"the generation prompt; {side} it the template raises: {refusal.message[:100]!r}.",
                           case, {"raised": side, "message": refusal.message[:300]})
            continue
        if not on.text.startswith(off.text):
            at = first_difference(off.text, on.text)
            prop.violation("not-an-append", f"In {case.id} the generation prompt changes the prompt at byte {at} "
                           f"instead of appending: {off.text[at:at + 40]!r} became {on.text[at:at + 40]!r}.",
                           case, {"offset": at, "without": snippet(off.text, at), "with": snippet(on.text, at)})
            continue
        suffixes.setdefault(_kwargs_key(case), []).append((case, on.text[len(off.text):]))
    common = {}
    for key, found in sorted(suffixes.items()):
        counts: dict = {}
        for _, suffix in found:
            counts[suffix] = counts.get(suffix, 0) + 1
        usual = max(sorted(counts), key=lambda s: counts[s])
        common[key] = usual
        for case, suffix in found:
            if suffix != usual:
                prop.violation("suffix-varies", f"{case.id} gets the generation prompt {suffix!r}; "
                               f"{counts[usual]} other conversation(s) with the same kwargs get {usual!r}.",
                               case, {"suffix": suffix, "usual": usual, "kwargs": key})
    return prop, common


# --- marker balance -------------------------------------------------------------------------------------------

def _tags(text: str) -> list[str]:
    """Tags that can mark a turn: not built from our sentinels, not reasoning tags (`<think>` sits inside
    Qwen3's assistant header)."""
    return [tag for tag in _TAG.findall(text)
            if not any(s in tag for s in SENTINELS) and not _REASONING_TAG.search(tag)]


def _around(text: Optional[str], sentinel: str, since: int = 0) -> Optional[tuple[Optional[str], Optional[str]]]:
    """(last tag before the sentinel, first tag after it), looking no further back than `since`."""
    if text is None or sentinel not in text[since:]:
        return None
    at = text.index(sentinel, since)
    before, after = _tags(text[since:at]), _tags(text[at + len(sentinel):])
    return (before[-1] if before else None), (after[0] if after else None)


class MarkerGroups:
    """Turn markers: groups of alternative openers and the closers that end their turns.

    Learnt from the probes: a role's opener is the last tag before its sentinel, its closer the first tag
    after it (the innermost markers, so Llama 3's `<|end_header_id|>` rather than the header's start); a tool
    call adds the tag that closes it, either to the group of the opener right before its arguments (gpt-oss
    `<|message|>...<|call|>`) or as a pair of its own (`<tool_call>...</tool_call>`). Roles sharing an opener
    or a closer share a group (Phi-3's `<|end|>`)."""

    def __init__(self):
        self.groups: list[tuple[set, set]] = []

    def add(self, opener: Optional[str], closer: Optional[str]) -> None:
        if not opener or not closer or opener == closer or opener.startswith("</"):
            return  # `</x>` ends something: seen as an opener, the turn has no closer of its own
        joined = [g for g in self.groups if opener in g[0] or closer in g[1]]
        openers, closers = {opener}, {closer}
        for group in joined:
            openers |= group[0]
            closers |= group[1]
            self.groups.remove(group)
        self.groups.append((openers, closers))

    def opener_group(self, tag: str) -> Optional[tuple[set, set]]:
        return next((g for g in self.groups if tag in g[0]), None)

    def consistent(self) -> list[tuple[set, set]]:
        """Groups whose tags do not also serve another group the other way round."""
        openers = {t for g in self.groups for t in g[0]}
        closers = {t for g in self.groups for t in g[1]}
        return sorted(((o, c) for o, c in self.groups if not (o & closers) and not (c & openers)),
                      key=lambda g: sorted(g[1]))


def learn_markers(probes: dict, prompt_suffix: Optional[str] = None) -> tuple[list, set, Optional[str]]:
    """(marker groups, roles whose markers were learnt, why no group was found) from the probe renders.

    A tag of the generation prompt opens the assistant's turn: it never closes one (a DeepSeek variant that
    ends every user turn with `<｜Assistant｜>`)."""
    user = _around(_text(probes.get("user")), USER)
    if user is None:
        return [], set(), "the template does not render a lone user message"
    markers = MarkerGroups()
    learned = {"user"}
    turn_closers = {user[1]}  # closers of whole turns, opener known or not (Mistral's assistant `</s>`)
    markers.add(*user)
    pair = _text(probes.get("user_assistant"))
    if pair is not None and USER in pair:
        since = pair.index(USER) + len(USER)
        if user[1] and user[1] in pair[since:]:  # past the user turn's own closer (Mistral's [/INST])
            since = pair.index(user[1], since) + len(user[1])
        found = _around(pair, ASSISTANT, since)
        if found is not None:
            learned.add("assistant")
            turn_closers.add(found[1])
            markers.add(*found)
    system = _around(_text(probes.get("system_user")), SYSTEM)
    if system is not None:
        learned.add("system")
        opener, closer = system
        if closer != user[0]:  # the user turn's opener right after the system text: a folded system, no closer
            markers.add(opener, closer)
    tool = _text(probes.get("tool"))
    if tool is not None and RESULT in tool:
        learned.add("tool")
        opener, closer = _around(tool, RESULT)
        group = next((g for g in markers.groups if closer in g[1]), None)
        header = tool[:tool.index(RESULT)]
        if group is not None and closer in header:
            header = header[header.rindex(closer):]
        # Bielik's `<|im_start|>user\n<|function_output|>R<|im_end|>`: the turn is opened already
        if group is None or not any(o in header for o in group[0]):
            markers.add(opener, closer)
        if VALUE in tool and tool.index(VALUE) < tool.index(RESULT):
            at = tool.index(VALUE)
            before = _TAG.findall(tool[:at])
            after = _tags(tool[at + len(VALUE):tool.index(RESULT)])
            if before and after and not any(s in before[-1] for s in SENTINELS):
                group = markers.opener_group(before[-1])
                if group is not None:
                    group[1].add(after[0])
                elif after[0] not in turn_closers and not any(before[-1] in g[1] for g in markers.groups):
                    markers.add(before[-1], after[0])
    prompt_tags = set(_TAG.findall(prompt_suffix or ""))
    groups = [(o, c) for o, c in markers.consistent() if not (c & prompt_tags)]
    _block_openers(groups, [_text(probes.get(name)) for name in ("user+tools", "system_user", "tool")])
    if not groups:
        return [], learned, "no turn markers found: no tag both precedes and follows the probe messages"
    return groups, learned, None


def _block_openers(groups: list, renders: list) -> None:
    """Blocks the template closes like a turn but opens with a tag no role probe showed (EXAONE's
    `<|tool_declare|>` ... `<|endofturn|>` around the tool list): in the probes' own renders, a closer with no
    opener since the previous closer makes the first tag of that stretch an opener of its group."""
    closers_all = {t for _, closers in groups for t in closers}
    for openers, closers in groups:
        for text in renders:
            if text is None:
                continue
            since, opened = 0, False
            for found in _TAG.finditer(text):
                tag = found.group(0)
                if tag in openers:
                    opened = True
                elif tag in closers:
                    if not opened:
                        first = next((t for t in _tags(text[since:found.start()]) if t not in closers_all), None)
                        if first is not None:
                            openers.add(first)
                    since, opened = found.end(), False


def _roles(conversation) -> set:
    return {m.get("role") for m in conversation.messages if isinstance(m, dict)}


_WORD_BEFORE = re.compile(r"[^\W\d_]{2,}[^\w\s]*[^\S\n]+$")


def template_prose(template: str) -> list[str]:
    """Where the template's own text mentions a marker (Bielik's "przekazane z markerem <|function_output|>",
    Phi-4's "format: <think> {Thought section} </think>"): a tag right after a word and a space (and its closing
    form right after it), with the words before it. Text, not turns."""
    fragments = []
    for literal in template_literals(template).split("\n"):
        for tag in _TAG.finditer(literal):
            before = literal[:tag.start()]
            if _WORD_BEFORE.search(before):
                closing = "</" + tag.group(0)[1:]  # `<tool_call></tool_call> XML tags:` names both
                rest = literal[tag.end():]
                fragments.append(before[-40:].lstrip() + tag.group(0) + (closing if rest.startswith(closing) else ""))
    return fragments


def marker_balance(template: str, cases: list, out: dict, probes: dict, prompt_suffix: Optional[str]) -> _Property:
    prop = _Property("marker-balance")
    groups, learned, why = learn_markers(probes, prompt_suffix)
    prose = template_prose(template)
    if not groups:
        prop.note = why
        return prop
    prop.note = "markers: " + "; ".join(f"{' '.join(sorted(o))} ... {' '.join(sorted(c))}" for o, c in groups)
    for case in cases:
        conversation = case.conversation
        text = _text(out.get(("base", case.id)))
        if text is None or conversation.continue_final_message or not _roles(conversation) <= learned:
            continue
        prop.checked += 1
        spans = input_spans(text, input_strings(conversation) + prose)
        tags = [(m.start(), m.group()) for m in _TAG.finditer(text) if not _inside(spans, m.start(), m.end())]
        prompt_at = None
        if conversation.add_generation_prompt:
            flip = _text(out.get(("flip", case.id)))
            if flip is not None and text.startswith(flip):
                prompt_at = len(flip)
            elif prompt_suffix and text.endswith(prompt_suffix):
                prompt_at = len(text) - len(prompt_suffix)
        for openers, closers in groups:
            problem = _scan_group(tags, openers, closers, prompt_at, conversation.add_generation_prompt)
            if problem and problem[3] and conversation.add_generation_prompt and \
                    not any(start > problem[2] for start, _ in spans):
                # a template that appends the assistant's header whatever add_generation_prompt says (flip is
                # the same render): the last turn is open on purpose when no input follows its opener
                problem = None
            if problem:
                kind, detail, at, _ = problem
                prop.violation(kind, f"In {case.id}, {detail}", case,
                               {"offset": at, "text": snippet(text, at), "openers": sorted(openers),
                                "closers": sorted(closers)})
                break
    return prop


def _scan_group(tags: list, openers: set, closers: set, prompt_at: Optional[int],
                generation_prompt: bool) -> Optional[tuple]:
    """The first imbalance of one marker group in a render's tags: (kind, words, offset, at the end), or None."""
    open_at, open_tag = None, None
    for at, tag in tags:
        if tag in openers:
            if open_at is not None:
                return ("unclosed-turn", f"the turn opened by {open_tag!r} at byte {open_at} is not closed (by "
                        f"{' or '.join(sorted(closers))}) before {tag!r} opens another at byte {at}.", open_at, False)
            open_at, open_tag = at, tag
        elif tag in closers:
            if open_at is None:
                return ("stray-closer", f"{tag!r} at byte {at} closes no open turn.", at, False)
            open_at = None
    if open_at is not None:
        if generation_prompt and (prompt_at is None or open_at >= prompt_at):
            return None  # the generation prompt opens the assistant's turn on purpose
        return ("unclosed-turn", f"the turn opened by {open_tag!r} at byte {open_at} is still open at the end of "
                f"the prompt{'' if generation_prompt else ' (no generation prompt was asked for)'}.", open_at, True)
    return None


# --- repr leaks and HTML escapes ------------------------------------------------------------------------------

_REPR = re.compile(r"\{'[^'\n]{0,80}'\s*:|\['[^'\n]{0,80}'(?:, '|\])|\b(?:None|True|False)\b")
_ESCAPE = re.compile(r"\\u00(?:3[cCeE]|26|27)|&(?:lt|gt|amp|quot|#39|#34|#x27);")


@lru_cache(maxsize=16)
def template_literals(template: str, kinds: tuple = ("data", "string")) -> str:
    """The text a template can print verbatim: its data and its string literals, unescaped (Jinja's own lexer),
    one per line."""
    import jinja2

    try:
        tokens = list(jinja2.Environment().lexer.tokenize(template))
    except Exception:  # a template Jinja cannot lex renders nothing we could blame on it
        return template
    return "\n".join(token.value for token in tokens if token.type in kinds)


def _json_values(value, found: set) -> None:
    if value is None or isinstance(value, bool):
        found.add(value)
    elif isinstance(value, dict):
        found.add("object")
        for item in value.values():
            _json_values(item, found)
    elif isinstance(value, list):
        found.add("array")
        for item in value:
            _json_values(item, found)


def json_input(conversation) -> set:
    """Which JSON shapes the input carries beyond plain string messages: object, array, None, True, False."""
    found: set = set()
    for message in conversation.messages:
        if not isinstance(message, dict):
            continue
        for key, value in message.items():
            if key != "role" and not isinstance(value, str):
                _json_values(value, found)
    for extra in (conversation.tools, conversation.documents):
        if extra is not None:
            _json_values(extra, found)
    for value in dict(conversation.kwargs).values():
        if not isinstance(value, str):
            _json_values(value, found)
    return found


def no_repr_leak(template: str, cases: list, out: dict) -> _Property:
    prop = _Property("no-repr-leak")
    literals = template_literals(template)
    # A bare None/True/False is the template's own where its text says it ("use 'Categories: None'"), not where
    # a string literal is just the word (`== 'None'` compares with it).
    own = "\n".join(chunk for chunk in template_literals(template).split("\n")
                    if chunk.strip().strip("'\"") not in ("None", "True", "False"))
    data_words = set(re.findall(r"\b(?:None|True|False)\b", own))
    for case in cases:
        text = _text(out.get(("base", case.id)))
        shapes = json_input(case.conversation)
        if text is None or not shapes:
            continue
        prop.checked += 1
        strings = input_strings(case.conversation)
        spans = input_spans(text, strings)
        words = {"None": None in shapes, "True": True in shapes, "False": False in shapes}
        for pattern, kind in ((_REPR, "python-repr"), (_ESCAPE, "html-escape")):
            for match in pattern.finditer(text):
                found = match.group(0)
                if _inside(spans, match.start(), match.end()):
                    continue
                if found in words:
                    if not words[found] or found in data_words:
                        continue  # not a value of the input, or the template's own text
                elif found in literals:
                    continue
                what = "a Python repr" if kind == "python-repr" else "an HTML escape"
                prop.violation(kind, f"In {case.id}, {found!r} at byte {match.start()} is {what} the input does "
                               f"not contain: {snippet(text, match.start(), 30)!r}.", case,
                               {"offset": match.start(), "found": found, "text": snippet(text, match.start())})
                break
            else:
                continue
            break
    return prop


# --- time invariance and determinism --------------------------------------------------------------------------

_MONTHS = ("january february march april may june july august september october november december "
           "jan feb mar apr jun jul aug sep sept oct nov dec").split()
_DAYS = "monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri sat sun".split()
_DATE_WORDS = set(_MONTHS) | set(_DAYS) | {"am", "pm", "st", "nd", "rd", "th", "utc", "gmt", "t", "z"}
_TOKEN = re.compile(r"\d+|[A-Za-z]+|\s+|.", re.DOTALL)


def _date_like(tokens: list) -> bool:
    return all(t.isdigit() or t.isspace() or t.lower() in _DATE_WORDS or t in ",.:/-+" for t in tokens)


def _same(a: Outcome, b: Outcome) -> bool:
    if isinstance(a, Raised):
        return isinstance(b, Raised) and a.message == b.message
    return isinstance(b, Rendered) and a.text == b.text


def _differing(prop: _Property, cases: list, out: dict, other: str):
    """(case, base outcome, `other` outcome) for every case whose two renders differ; counts the checked."""
    for case in cases:
        a, b = out.get(("base", case.id)), out.get((other, case.id))
        if isinstance(a, (Rendered, Raised)) and isinstance(b, (Rendered, Raised)):
            prop.checked += 1
            if not _same(a, b):
                yield case, a, b


def time_invariance(template: str, cases: list, out: dict) -> _Property:
    prop = _Property("time-invariance")
    reads_clock = "strftime_now" in template
    for case, a, b in _differing(prop, cases, out, "clock"):
        later = shifted_now(case.conversation.now)
        if isinstance(a, Rendered) and isinstance(b, Rendered):
            at = first_difference(a.text, b.text)
            # only the stretch between the common prefix and suffix is diffed, token by token; widened to whole
            # words, so "June" -> "July" is read as two month names, not as "ne" -> "ly"
            end = first_difference(a.text[at:][::-1], b.text[at:][::-1])
            start = at
            while start > 0 and a.text[start - 1].isalnum():
                start -= 1
            while end > 0 and a.text[len(a.text) - end].isalnum():
                end -= 1
            left = _TOKEN.findall(a.text[start:len(a.text) - end])
            right = _TOKEN.findall(b.text[start:len(b.text) - end])
            matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
            changes = [(left[i1:i2], right[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
            evidence = {"offset": at, "now": case.conversation.now, "moved_to": later,
                        "text": snippet(a.text, at), "moved_text": snippet(b.text, at)}
            if reads_clock and all(_date_like(x) and _date_like(y) for x, y in changes):
                prop.exception("reads-clock", f"In {case.id} the template prints the clock's date: "
                               f"{a.text[at:at + 30]!r} became {b.text[at:at + 30]!r} at {later}.", case, evidence)
                continue
            prop.violation("clock-changes-more-than-the-date",
                           f"In {case.id}, moving the clock to {later} changes more than a printed date at byte {at}: "
                           f"{a.text[at:at + 40]!r} became {b.text[at:at + 40]!r}.", case, evidence)
        else:
            prop.violation("clock-changes-the-outcome", f"In {case.id}, moving the clock to {later} turns a "
                           f"{a.kind} outcome into a {b.kind} one.", case,
                           {"now": case.conversation.now, "moved_to": later, "outcome": a.kind, "moved_outcome": b.kind})
    if reads_clock:
        prop.note = "the template calls strftime_now"
    return prop


def determinism(cases: list, out: dict) -> _Property:
    prop = _Property("determinism")
    for case, a, b in _differing(prop, cases, out, "again"):
        if isinstance(a, Rendered) and isinstance(b, Rendered):
            at = first_difference(a.text, b.text)
            prop.violation("renders-differ", f"Two renders of {case.id} differ at byte {at}: "
                           f"{a.text[at:at + 40]!r} vs {b.text[at:at + 40]!r}.", case,
                           {"offset": at, "first": snippet(a.text, at), "second": snippet(b.text, at)})
        else:
            prop.violation("outcomes-differ", f"Two renders of {case.id} end differently: {a.kind} then {b.kind}.",
                           case, {"first": a.kind, "second": b.kind})
    return prop


# --- faithfulness ---------------------------------------------------------------------------------------------

_ROLES = ("system", "developer", "user", "assistant", "tool")


def _part_texts(content) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content
                if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str)]
    return []


def _leaves(value) -> list[str]:
    """The string values inside an argument (numbers and booleans print too many ways to be looked for)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return []


def _strings(value) -> list[str]:
    """Every string value and key inside value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [str(key), *_strings(item)]]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings(item)]
    return []


def _message_items(message: dict) -> list[tuple[str, str]]:
    role = message.get("role")
    calls = message.get("tool_calls") or []
    kind = "content:" + (role if role in _ROLES else "other")
    if role == "assistant" and calls:
        kind = "content:assistant-with-tool-calls"
    items = [(kind, text) for text in _part_texts(message.get("content"))]
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        if isinstance(function.get("name"), str):
            items.append(("tool-call:name", function["name"]))
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        items.extend(("tool-call:argument", leaf) for leaf in _leaves(arguments))
    return items


def _tool_items(tool: dict) -> list[tuple[str, str]]:
    function = tool.get("function", tool)
    items = [("tool:name", function["name"])] if isinstance(function.get("name"), str) else []
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if isinstance(properties, dict):
        items.extend(("tool:parameter", name) for name in properties)
    return items


def faithfulness_items(conversation) -> list[tuple[str, str]]:
    """(kind, text) of everything the conversation hands the template that must reach the prompt.

    An item whose text also occurs in another part of the input (a parameter name that is also an argument
    key, a tool name that a call repeats) is left out: finding it in the prompt would prove nothing."""
    owners = []  # (items, strings) per message, tool and document
    for message in conversation.messages:
        if isinstance(message, dict):
            owners.append((_message_items(message), _strings(message)))
    for tool in conversation.tools or []:
        if isinstance(tool, dict):
            owners.append((_tool_items(tool), _strings(tool)))
    for document in conversation.documents or []:
        if isinstance(document, dict):
            owners.append(([("document", value) for key, value in document.items()
                            if key in ("text", "content", "snippet") and isinstance(value, str)], _strings(document)))
    kwargs = _strings(dict(conversation.kwargs))
    items = []
    for index, (own, _) in enumerate(owners):
        # one string to search: the other owners' strings, apart so no match spans two of them
        others = "\x00".join([s for other, (_, strings) in enumerate(owners) if other != index for s in strings]
                              + kwargs)
        for kind, text in own:
            if len(text.strip()) >= 2 and text.strip() not in others:
                items.append((kind, text))
    return items


def present(text: str, rendered: str) -> bool:
    """Whether text reached the prompt: verbatim, trimmed, JSON-escaped, with whitespace collapsed, line by line,
    or (for reasoning cut out of content, `content.split('</think>')`) its part after `</think>`."""
    value = text.strip()
    if re.fullmatch(r"\w+", value):  # a name (`location`, `pi`): whole words only, not inside other words
        return re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", rendered) is not None
    if any(form in rendered for form in _forms(value)):
        return True
    if " ".join(value.split()) in " ".join(rendered.split()):
        return True
    lines = [line.strip() for line in value.splitlines() if line.strip()]
    if len(lines) > 1 and all(line in rendered for line in lines):
        return True
    if "</think>" in value:
        answer = value.split("</think>")[-1].strip()
        return not answer or answer in rendered
    return False


def faithfulness(template: str, cases: list, out: dict) -> _Property:
    prop = _Property("faithfulness")
    literals = template_literals(template)
    rendered: dict = {}   # kind -> a case that rendered an item of this kind
    dropped: dict = {}    # kind -> [(case, text)]
    for case in cases:
        text = _text(out.get(("base", case.id)))
        items = faithfulness_items(case.conversation)
        if text is None or not items:
            continue
        prop.checked += 1
        for kind, value in items:
            if present(value, literals):
                continue  # the template's own text has it (Qwen3Guard's "user's query"): finding it proves nothing
            if present(value, text):
                rendered.setdefault(kind, case)
            else:
                dropped.setdefault(kind, []).append((case, value))
    for kind, lost in sorted(dropped.items()):
        for case, value in lost:
            evidence = {"item": kind, "missing": value[:200]}
            if kind in rendered:
                prop.violation(f"drops-{kind}", f"In {case.id} the {kind} {value[:50]!r} is missing, although "
                               f"{rendered[kind].id} shows that the template renders {kind}.", case,
                               {**evidence, "rendered_in": rendered[kind].id})
            else:
                prop.exception(f"never-renders-{kind}", f"The template never renders {kind}: in {case.id}, "
                               f"{value[:50]!r} is missing.", case, evidence)
    return prop


# --- one template ---------------------------------------------------------------------------------------------

def analyze(template: str, cases: list, out: dict) -> dict:
    """The property record of one template from its renders ((kind, name) -> outcome)."""
    base = [out.get(("base", case.id)) for case in cases]
    prompt, suffixes = generation_prompt(cases, out)
    usual = suffixes.get(json.dumps({}))
    probes = {name: out.get(("probe", name)) for name in PROBES}
    if not isinstance(probes["user"], Rendered):  # the template needs tools: learn from the probes with tools
        probes.update({name: probes[f"{name}+tools"] for name in PROBES if f"{name}+tools" in PROBES})
    found = {
        "prefix-stability": prefix_stability(cases, out),
        "generation-prompt": prompt,
        "marker-balance": marker_balance(template, cases, out, probes, usual),
        "no-repr-leak": no_repr_leak(template, cases, out),
        "time-invariance": time_invariance(template, cases, out),
        "determinism": determinism(cases, out),
        "faithfulness": faithfulness(template, cases, out),
    }
    properties = {name: found[name].record() for name in PROPERTY_IDS}
    return {
        "format": FORMAT_VERSION,
        "renders": {"cases": len(cases), "rendered": sum(isinstance(o, Rendered) for o in base),
                    "raised": sum(isinstance(o, Raised) for o in base)},
        "generation_prompts": suffixes,
        "properties": properties,
        "violated": [name for name in PROPERTY_IDS if properties[name]["status"] == "violation"],
    }


def check_reference(template_id: str, out: dict) -> None:
    """ValueError when the reference itself failed a render (a crash or timeout, never a template refusal)."""
    for (kind, name), outcome in out.items():
        if isinstance(outcome, (Errored, Skipped)):
            raise ValueError(f"{template_id}: {kind} render of {name}: {outcome.kind}: {outcome.message}")


class StoredRecords:
    """Property records in the result store beside the reference's outcomes. A record is a function of the
    reference (its runner identity), every render's request (template, case data, variant) and the code that
    derives it, so a warm run neither renders the determinism check's repeat nor analyzes again."""

    CODE = ("conformance/analysis/properties.py", "conformance/analysis/capabilities.py",
            "conformance/judge/goldens.py", "runners/base.py")

    def __init__(self, store, runner):
        import hashlib

        from conformance.render.store import identity_digest

        self.store, self.identity = store, None
        found = store.identity_of(runner)
        if found is not None:
            root = Path(__file__).resolve().parent.parent.parent
            code = hashlib.sha256(b"".join((root / name).read_bytes() for name in self.CODE)).hexdigest()
            identity = {"name": "properties", "reference": found[1], "code": code}
            self.identity = (identity_digest(identity), identity)

    def key(self, pairs: list) -> Optional[tuple]:
        """(template key, record key) of one template's renders; None when one is not JSON data."""
        import hashlib

        from conformance.render.store import PROPERTIES_PREFIX, request_keys

        keys = request_keys([request for _, request in pairs])
        if self.identity is None or not keys or any(key is None for key in keys):
            return None
        detail = json.dumps([[list(name), key[1]] for (name, _), key in zip(pairs, keys)])
        return keys[0][0], PROPERTIES_PREFIX + hashlib.sha256(detail.encode("utf-8", ENCODING_ERRORS)).hexdigest()

    def get(self, key: Optional[tuple]) -> Optional[dict]:
        return None if key is None else self.store.side(self.identity, key[0], key[1], "properties")

    def put(self, key: Optional[tuple], record: dict) -> None:
        if key is not None:
            self.store.write(self.identity, key[0], {key[1]: ["properties", record]})


def compute_properties(templates: Iterable, runner, cases: Optional[list] = None, chunk: int = 16,
                       progress: Optional[Callable[[int, int], None]] = None,
                       each: Optional[Callable[[object, str, list, dict, dict], None]] = None,
                       repeat=None, store=None) -> tuple[dict, list]:
    """template id -> property record, plus failures [(template id, message)].

    `templates` are corpus entries (or anything with id, source(), bos_token, eos_token); renders go through
    `runner.render_many` a few templates at a time, so memory stays bounded on the whole corpus. `each(entry,
    source, cases, renders, record)` sees every template's renders before they are dropped (lint's finding
    classes, analysis/findings.py). `repeat`: the runner for the determinism check's second render (`again`)
    when `runner` answers from a result store (render/store.CachedRunner), which would hand back the first
    render's bytes; the repeat must really render again (default: `runner`). `store`: a result store holding
    each template's record once derived (StoredRecords; not with `each`, which needs the renders)."""
    from conformance.corpus.cases import load_cases

    templates = list(templates)
    cases = load_cases() if cases is None else cases
    stored = StoredRecords(store, runner) if store is not None and each is None else None
    results, failures = {}, []
    for start in range(0, len(templates), chunk):
        batch = templates[start:start + chunk]
        keyed = []
        for entry in batch:
            source = entry.source()
            pairs = property_requests(source, entry.bos_token, entry.eos_token, cases, entry.id)
            record_key = stored.key(pairs) if stored is not None else None
            record = stored.get(record_key) if stored is not None else None
            if record is not None:
                results[entry.id] = record
                continue
            keyed.append((entry, source, pairs, record_key))
        pairs_all = [(name, request) for _, _, pairs, _ in keyed for name, request in pairs]
        if not pairs_all:
            outcomes = iter(())
        elif repeat is None:
            outcomes = iter(runner.render_many([request for _, request in pairs_all]))
        else:
            again = [key[0] == "again" for key, _ in pairs_all]
            rest = iter(runner.render_many([r for (_, r), a in zip(pairs_all, again) if not a]))
            repeated = iter(repeat.render_many([r for (_, r), a in zip(pairs_all, again) if a]))
            outcomes = iter([next(repeated) if a else next(rest) for a in again])
        for entry, source, pairs, record_key in keyed:
            out = {key: next(outcomes) for key, _ in pairs}
            try:
                check_reference(entry.id, out)
            except ValueError as exc:
                failures.append((entry.id, str(exc)))
                continue
            results[entry.id] = analyze(source, cases, out)
            if stored is not None:
                stored.put(record_key, results[entry.id])
            if each is not None:
                each(entry, source, cases, out, results[entry.id])
        if progress:
            progress(min(start + chunk, len(templates)), len(templates))
    return results, failures


# --- goldens --------------------------------------------------------------------------------------------------

def properties_path(template_id: str, root: Optional[Path] = None) -> Path:
    return (root or goldens_dir()) / template_id / PROPERTIES_FILE


def encode_properties(record: dict) -> bytes:
    return encode_record(record)


def load_properties(template_id: str, root: Optional[Path] = None) -> Optional[dict]:
    return load_record(properties_path(template_id, root))


def update_property_goldens(templates: Iterable, runner, root: Optional[Path] = None,
                            progress: Optional[Callable[[int, int], None]] = None) -> tuple[int, list]:
    """Write goldens/<id>/properties.json for each template; returns (files changed, failures)."""
    results, failures = compute_properties(templates, runner, progress=progress)
    written = 0
    for template_id, record in sorted(results.items()):
        path = properties_path(template_id, root)
        data = encode_properties(record)
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data)
            written += 1
    return written, failures


def summarize(records: dict) -> dict:
    """Per property over many templates: templates with a violation, with only exceptions, passing, not
    applicable; and per violation/exception kind, how many templates show it."""
    summary = {name: {"templates": 0, **{status: 0 for status in STATUSES}, "violation_kinds": {},
                      "exception_kinds": {}} for name in PROPERTY_IDS}
    for record in records.values():
        for name in PROPERTY_IDS:
            row, result = summary[name], record["properties"][name]
            row["templates"] += 1
            row[result["status"]] += 1
            for field, table in (("violations", "violation_kinds"), ("exceptions", "exception_kinds")):
                for finding in result[field]:
                    row[table][finding["kind"]] = row[table].get(finding["kind"], 0) + 1
    return summary


def properties_section(template_ids: Iterable[str], records: Optional[dict] = None,
                       root: Optional[Path] = None) -> dict:
    """The report's `properties` section: per property, how many templates violate it (and by which kinds),
    show only intended exceptions, pass, or have nothing to check; per template, its violations (the
    property, the kind, the minimal case, the two-line explanation). `records` derived this session, else
    the stored goldens/<id>/properties.json."""
    template_ids = list(template_ids)
    if records is None:
        records = {t: r for t in template_ids if (r := load_properties(t, root)) is not None}
    records = {t: records[t] for t in template_ids if t in records}
    templates = {}
    for template_id, record in sorted(records.items()):
        found = [{"property": name, "kind": finding["kind"], "case": finding["case"], "count": finding["count"],
                  "explanation": finding["explanation"]}
                 for name in record["violated"] for finding in record["properties"][name]["violations"]]
        if found:
            templates[template_id] = found
    return {"format": FORMAT_VERSION, "templates": len(template_ids), "recorded": len(records),
            "clean": sum(1 for r in records.values() if not r["violated"]),
            "properties": summarize(records), "violations": templates}


def property_summary(record: Optional[dict]) -> Optional[dict]:
    """One template's results in short: property -> status, and the violation and exception kinds."""
    if record is None:
        return None
    return {name: {"status": result["status"], "violations": [f["kind"] for f in result["violations"]],
                   "exceptions": [f["kind"] for f in result["exceptions"]]}
            for name, result in record["properties"].items()}


def property_line(record: Optional[dict]) -> str:
    """One line for `chatgold corpus list`."""
    if record is None:
        return "none recorded (run `chatgold properties update`)"
    parts = []
    for name in PROPERTY_IDS:
        result = record["properties"][name]
        if result["violations"]:
            parts.append(f"{name} VIOLATED ({', '.join(f['kind'] for f in result['violations'])})")
    excepted = [f"{name}: {f['kind']}" for name in PROPERTY_IDS for f in record["properties"][name]["exceptions"]]
    head = f"{len(record['violated'])} of {len(PROPERTY_IDS)} violated" + (f": {'; '.join(parts)}" if parts else "")
    return head + (f"; intended exceptions: {', '.join(excepted)}" if excepted else "")
