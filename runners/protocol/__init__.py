"""The chatgold harness protocol: newline-delimited JSON over a harness process's stdin/stdout.

See PROTOCOL.md beside this file for the specification. This module holds the wire mapping shared by the
client (runners.command) and the Python harness helper (runners.harness).
"""
from __future__ import annotations

import json
from typing import Any

from ..base import Errored, Outcome, Raised, Rendered, RenderRequest, Skipped

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A harness sent something the protocol does not allow."""


def encode(message: dict) -> bytes:
    # ensure_ascii keeps every line pure ASCII: no harness can be confused by an encoding or a U+2028.
    return (json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def render_message(seq: int, request: RenderRequest) -> dict:
    return {"cmd": "render", "seq": seq, **request.to_wire()}


def request_from_message(message: dict) -> RenderRequest:
    return RenderRequest(
        template=message["template"],
        messages=message["messages"],
        bos_token=message.get("bos_token"),
        eos_token=message.get("eos_token"),
        tools=message.get("tools"),
        documents=message.get("documents"),
        add_generation_prompt=bool(message.get("add_generation_prompt", False)),
        continue_final_message=bool(message.get("continue_final_message", False)),
        kwargs=message.get("kwargs") or {},
        now=message.get("now") or RenderRequest.__dataclass_fields__["now"].default,
    )


def outcome_message(seq: int, outcome: Outcome) -> dict:
    if isinstance(outcome, Rendered):
        return {"seq": seq, "text": outcome.text}
    if isinstance(outcome, Raised):
        return {"seq": seq, "raised": {"message": outcome.message}}
    if isinstance(outcome, Skipped):
        return {"seq": seq, "skipped": {"reason": outcome.reason}}
    return {"seq": seq, "errored": {"message": outcome.message, "stderr": outcome.detail}}


def outcome_from_message(message: Any, expected_seq: int) -> Outcome:
    """Map a harness's render response to an Outcome, or raise ProtocolError naming what is wrong."""
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
        return Raised(str(body.get("message", "")))
    if key == "skipped":
        return Skipped(str(body.get("reason", "")))
    return Errored(str(body.get("message", "harness reported an error")), str(body.get("stderr", "") or ""))
