"""The chatgold harness protocol: newline-delimited JSON over a harness process's stdin/stdout.

See PROTOCOL.md beside this file for the specification. This module holds the wire mapping shared by the
client (runners.command) and the Python harness helper (runners.harness).

Version 2 adds, negotiated at `start` so that version-1 harnesses keep working: the kind of every refusal
(compile, raise, render), `batch` (one template, many conversations, one reply line per conversation), the
reference's exact template variables on request (`bindings`), and an optional `build` identity that lets
chatgold reuse a harness's earlier outcomes.
"""
from __future__ import annotations

import json
import marshal
from json.encoder import encode_basestring_ascii as _ascii_string
from typing import Any, Optional, Sequence

from ..base import (
    Conversation,
    Errored,
    Outcome,
    Raised,
    RefusalKind,
    Rendered,
    RenderRequest,
    Skipped,
)

PROTOCOL_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
REFUSAL_KINDS = tuple(k.value for k in RefusalKind if k != RefusalKind.UNKNOWN)


class ProtocolError(ValueError):
    """A harness sent something the protocol does not allow."""


def encode(message: dict) -> bytes:
    # ensure_ascii keeps every line pure ASCII: no harness can be confused by an encoding or a U+2028.
    return (json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _conversation_body(request: RenderRequest, bindings: bool) -> dict:
    body = request.conversation.to_dict()
    if bindings:
        from ..semantics import reference_bindings

        body["bindings"] = reference_bindings(request)
    return body


def render_message(seq: int, request: RenderRequest, bindings: bool = False) -> dict:
    return {"cmd": "render", "seq": seq, "template": request.template, "bos_token": request.bos_token,
            "eos_token": request.eos_token, **_conversation_body(request, bindings)}


def batch_message(seq: int, requests: Sequence[RenderRequest], bindings: bool = False,
                  kept: Optional["KeptConversations"] = None) -> dict:
    """One template (with its special tokens) and several conversations; the harness answers with one
    render response per conversation, seq, seq + 1, ... in order. With `kept` (a harness that keeps
    conversations, and no bindings), a conversation the process already holds goes as {"ref": K}."""
    first = requests[0]
    for request in requests[1:]:
        if (request.template, request.bos_token, request.eos_token) != (first.template, first.bos_token,
                                                                         first.eos_token):
            raise ValueError("a batch holds one template with one pair of special tokens")
    if kept is None or bindings:
        cases = [_conversation_body(r, bindings) for r in requests]
    else:
        cases = []
        for request in requests:
            number, known = kept.number(request.conversation)
            if known:
                cases.append({"ref": number})
            else:
                cases.append({"keep": number, **request.conversation.to_dict()} if number is not None
                             else request.conversation.to_dict())
    return {"cmd": "batch", "seq": seq, "template": first.template, "bos_token": first.bos_token,
            "eos_token": first.eos_token, "cases": cases}


class KeptConversations:
    """The client's side of `keep` for one harness process: the number each conversation is kept under.

    A run sends the same few conversations with every template; a harness that keeps them (its start response
    says how many) gets each in full once, with "keep": K, and {"ref": K} after that, so neither side encodes
    or parses it again. Keyed by object (id() reuse is guarded by holding the object)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._numbers: dict = {}

    def number(self, conversation: Conversation) -> tuple:
        """(K, True) for a conversation the process holds; (K, False) for one to send with "keep": K;
        (None, False) once the harness's limit is reached."""
        entry = self._numbers.get(id(conversation))
        if entry is not None and entry[0] is conversation:
            return entry[1], True
        if len(self._numbers) >= self.limit:
            return None, False
        number = len(self._numbers)
        self._numbers[id(conversation)] = (conversation, number)
        return number, False


# Each conversation's JSON, by object: a run sends the same few conversations with every template, so each
# is encoded once rather than once per batch (id() reuse is guarded by keeping the object).
_ENCODED_CASES: dict = {}
_ENCODED_CASES_LIMIT = 4096


def _encoded_case(conversation: Conversation) -> str:
    entry = _ENCODED_CASES.get(id(conversation))
    if entry is not None and entry[0] is conversation:
        return entry[1]
    text = json.dumps(conversation.to_dict(), ensure_ascii=True, separators=(",", ":"))
    if len(_ENCODED_CASES) >= _ENCODED_CASES_LIMIT:
        _ENCODED_CASES.clear()
    _ENCODED_CASES[id(conversation)] = (conversation, text)
    return text


def encode_batch(seq: int, requests: Sequence[RenderRequest], bindings: bool = False,
                 kept: Optional[KeptConversations] = None) -> bytes:
    """encode(batch_message(...)), byte for byte, from each conversation's cached encoding."""
    if bindings:
        return encode(batch_message(seq, requests, bindings))
    first = requests[0]
    head = batch_message(seq, requests[:1])
    del head["cases"]
    text = json.dumps(head, ensure_ascii=True, separators=(",", ":"))
    for request in requests[1:]:
        if (request.template, request.bos_token, request.eos_token) != (first.template, first.bos_token,
                                                                         first.eos_token):
            raise ValueError("a batch holds one template with one pair of special tokens")
    if kept is None:
        cases = ",".join(_encoded_case(request.conversation) for request in requests)
    else:
        entries = []
        for request in requests:
            number, known = kept.number(request.conversation)
            if known:
                entries.append('{"ref":%d}' % number)
            elif number is not None:
                entries.append('{"keep":%d,' % number + _encoded_case(request.conversation)[1:])
            else:
                entries.append(_encoded_case(request.conversation))
        cases = ",".join(entries)
    return (text[:-1] + ',"cases":[' + cases + "]}\n").encode("ascii")


def request_from_message(message: dict) -> RenderRequest:
    return RenderRequest(template=message["template"], conversation=Conversation.from_dict(message),
                         bos_token=message.get("bos_token"), eos_token=message.get("eos_token"))


def requests_from_batch(message: dict, kept: Optional[dict] = None, fresh: bool = True) -> list:
    """The batch's cells in order: a RenderRequest each, or an Errored outcome for a {"ref": K} this process
    does not hold. With `kept` (a harness that keeps conversations), entries carrying "keep": K are held.

    A kept conversation is held as marshal bytes and every reference gets fresh objects from them: an engine
    handed live Python data may change it while rendering (a template's `messages.pop()`, a request layer
    rewriting arguments in place), and one cell must never see what another did (marshal: exact types, a
    third of the JSON parse). `fresh=False` is for an engine that only reads what it is handed (it copies the
    data into its own values first): the Conversation is built once and every reference shares it."""
    template, bos, eos = message["template"], message.get("bos_token"), message.get("eos_token")
    cells: list = []
    for case in message["cases"]:
        if kept is not None and "ref" in case and len(case) == 1:
            held = kept.get(case["ref"])
            if held is None:
                cells.append(Errored(f"protocol violation: no conversation kept as {case['ref']!r}"))
                continue
            if not fresh:
                cells.append(RenderRequest(template, held, bos, eos))
                continue
            case = marshal.loads(held)
        elif kept is not None and "keep" in case:
            if not fresh:
                conversation = kept[case["keep"]] = Conversation.from_dict(case)
                cells.append(RenderRequest(template, conversation, bos, eos))
                continue
            kept[case["keep"]] = marshal.dumps(case)
        cells.append(RenderRequest(template, Conversation.from_dict(case), bos, eos))
    return cells


def outcome_message(seq: int, outcome: Outcome, version: int = PROTOCOL_VERSION) -> dict:
    if isinstance(outcome, Rendered):
        return {"seq": seq, "text": outcome.text}
    if isinstance(outcome, Raised):
        body = {"message": outcome.message}
        if version >= 2:
            # A harness that cannot tell says render: the widest kind, never a false match with a compile error.
            body["kind"] = str(outcome.refusal if outcome.refusal != RefusalKind.UNKNOWN else RefusalKind.RENDER)
        return {"seq": seq, "raised": body}
    if isinstance(outcome, Skipped):
        return {"seq": seq, "skipped": {"reason": outcome.message}}
    body = {"message": outcome.message, "stderr": outcome.detail}
    if outcome.timed_out:
        body["timed_out"] = True
    return {"seq": seq, "errored": body}


def encode_outcome(seq: int, outcome: Outcome, version: int = PROTOCOL_VERSION) -> bytes:
    """encode(outcome_message(...)), byte for byte; a rendered text (most answers) without building the dict."""
    if type(outcome) is Rendered and type(seq) is int:
        return b'{"seq":%d,"text":%s}\n' % (seq, _ascii_string(outcome.text).encode("ascii"))
    return encode(outcome_message(seq, outcome, version))


try:
    from orjson import OPT_APPEND_NEWLINE as _NEWLINE, dumps as _orjson_dumps
except ImportError:  # a harness interpreter without orjson (a cached engine environment) answers in ASCII
    _orjson_dumps = None


def answer_line(seq: int, outcome: Outcome, version: int = PROTOCOL_VERSION) -> bytes:
    """A harness's response line: the message of encode_outcome as UTF-8 JSON (the framing allows it), written
    by orjson where the interpreter has it (half the CPU of json's ASCII escaping, once per cell); what orjson
    refuses (a lone surrogate, which UTF-8 cannot carry) goes as encode_outcome's ASCII escapes."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(outcome_message(seq, outcome, version), option=_NEWLINE)
        except TypeError:
            pass
    return encode_outcome(seq, outcome, version)


def outcome_from_message(message: Any, expected_seq: int, version: int = PROTOCOL_VERSION) -> Outcome:
    """Map a harness's render response to an Outcome, or raise ProtocolError naming what is wrong."""
    if type(message) is dict and len(message) == 2 and message.get("seq") == expected_seq:
        text = message.get("text")
        if type(text) is str:
            return Rendered(text)  # most answers: what the checks below would conclude, without them
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    if message.get("seq") != expected_seq:
        raise ProtocolError(f"expected seq {expected_seq}, got {message.get('seq')!r}")
    keys = [k for k in ("text", "raised", "skipped", "errored") if k in message]
    if len(keys) != 1:
        raise ProtocolError(f"a response carries exactly one of text/raised/skipped/errored, got {keys or 'none'}")
    key = keys[0]
    body = message[key]
    if key == "text":
        if not isinstance(body, str):
            raise ProtocolError("text must be a string")
        return Rendered(body)
    if not isinstance(body, dict):
        raise ProtocolError(f"{key} must be an object")
    if key == "raised":
        return Raised(str(body.get("message", "")), _refusal_kind(body, version))
    if key == "skipped":
        return Skipped(str(body.get("reason", "")))
    return Errored(str(body.get("message", "harness reported an error")), str(body.get("stderr", "") or ""),
                   timed_out=body.get("timed_out") is True)


def _refusal_kind(body: dict, version: int) -> RefusalKind:
    if version < 2:
        return RefusalKind.UNKNOWN
    kind = body.get("kind")
    if kind not in REFUSAL_KINDS:
        raise ProtocolError(f"raised.kind must be one of {', '.join(REFUSAL_KINDS)} in protocol version 2, "
                            f"got {kind!r}")
    return RefusalKind(kind)


def negotiated_version(info: dict) -> int:
    """The version a start response settles on: 2 only when the harness says so."""
    return 2 if info.get("protocol") == 2 else 1


def start_message(version: int = PROTOCOL_VERSION) -> dict:
    return {"cmd": "start", "version": version}


def harness_description(info: dict, version: int, build: Optional[str] = None, bindings: bool = False,
                        keep: int = 0, hold: bool = False) -> dict:
    """A start response: the engine's description, plus, in version 2, what the harness speaks."""
    answer = dict(info)
    if version >= 2:
        answer["protocol"] = 2
        if build:
            answer["build"] = build
        if bindings:
            answer["bindings"] = True
        if keep:
            answer["keep"] = keep
        if hold:
            answer["hold"] = True
    return answer
