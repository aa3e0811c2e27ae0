"""Check a harness's traffic against the protocol's JSON Schemas (the *.schema.json files beside this module).

Two uses:

- in-process: `CommandRunner(argv, validate=True)` calls `check_request`/`check_response` on every message it
  sends and receives; a response that breaks a schema costs that cell (Errored naming the schema) like garbage;
- from the shell, for an engine author: `python -m runners.protocol.validate -- <harness argv...>` starts the
  harness, sends a fixed set of probe renders, validates every line both ways and exits 0 only when the whole
  exchange conformed (the outcomes themselves -- rendered, raised, skipped -- are the engine's business).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from functools import lru_cache
from typing import Any, Optional, Sequence

from . import ProtocolError

SCHEMA_DIR = os.path.dirname(os.path.abspath(__file__))
# message kind -> schema file
SCHEMAS = {
    "start": "start.schema.json",
    "start-response": "start-response.schema.json",
    "render": "render.schema.json",
    "batch": "batch.schema.json",
    "conversation": "conversation.schema.json",
    "render-response": "render-response.schema.json",
    "stop": "stop.schema.json",
}
REQUEST_KINDS = {"start": "start", "render": "render", "batch": "batch", "stop": "stop"}


@lru_cache(maxsize=None)
def schema_registry():
    """Every protocol schema, by $id, so that one may $ref another (conversation.schema.json)."""
    from referencing import Registry, Resource

    resources = []
    for name in sorted(os.listdir(SCHEMA_DIR)):
        if name.endswith(".schema.json"):
            with open(os.path.join(SCHEMA_DIR, name), encoding="utf-8") as handle:
                schema = json.load(handle)
            resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def load_schema(name: str) -> dict:
    with open(os.path.join(SCHEMA_DIR, name), encoding="utf-8") as handle:
        return json.load(handle)


@lru_cache(maxsize=None)
def _validator(kind: str):
    from jsonschema import Draft202012Validator

    schema = load_schema(SCHEMAS[kind])
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=schema_registry())


def schema_errors(kind: str, message: Any) -> list[str]:
    """Every way `message` breaks the schema for `kind`, as readable lines (empty when it conforms)."""
    errors = sorted(_validator(kind).iter_errors(message), key=lambda e: list(e.absolute_path))
    out = []
    for error in errors:
        where = "/".join(str(p) for p in error.absolute_path) or "<top>"
        out.append(f"{where}: {error.message}")
    return out


def check(kind: str, message: Any) -> None:
    problems = schema_errors(kind, message)
    if problems:
        raise ProtocolError(f"{SCHEMAS[kind]}: " + "; ".join(problems[:3]))


def check_request(message: dict) -> None:
    kind = REQUEST_KINDS.get(message.get("cmd")) if isinstance(message, dict) else None
    if kind is None:
        raise ProtocolError(f"not a protocol request: {message!r:.200}")
    check(kind, message)


def check_response(kind: str, line: bytes) -> Any:
    """Decode one response line strictly (UTF-8, one JSON value) and validate it; returns the message."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"response line is not UTF-8: {exc}") from exc
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"response line is not one JSON value: {exc}") from exc
    check(kind, message)
    return message


# Probe renders for the shell check: simple, refusing, non-ASCII (incl. U+2028, which JavaScript's JSON
# handling once treated as a line break), kwargs, an undefined bos_token, the frozen clock.
def probe_requests():
    from ..base import RenderRequest

    loop = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    hello = [{"role": "user", "content": "Hello"}]
    return [
        ("plain", RenderRequest.make(loop, hello, bos_token="<s>", eos_token="</s>")),
        ("raise_exception", RenderRequest.make("{{ raise_exception('nope') }}", hello)),
        ("unicode", RenderRequest.make(loop, [{"role": "user", "content": "h\u00e9 \u4e16\u754c \U0001F600 \u2028 \"q\"\n"}])),
        ("kwargs", RenderRequest.make("{{ greeting }} {{ enable_thinking }}", hello,
                                 kwargs={"greeting": "hi", "enable_thinking": False})),
        ("undefined-bos", RenderRequest.make("[{{ bos_token }}]{% if bos_token is defined %}defined{% endif %}", hello)),
        ("strftime_now", RenderRequest.make("{{ strftime_now('%Y-%m-%d') }}", hello, now="2024-07-04T12:34:56+00:00")),
        ("generation", RenderRequest.make(loop + "{% if add_generation_prompt %}<assistant>{% endif %}", hello,
                                     add_generation_prompt=True)),
    ]


def validate_harness(argv: Sequence[str], timeout: float = 20.0, out=sys.stdout, cwd: Optional[str] = None,
                     start_timeout: float = 60.0) -> bool:
    """Run the probes through `argv` with schema validation on; print one line per probe; True if all conform."""
    from ..base import Errored, RunnerUnavailable
    from ..command import CommandRunner

    runner = CommandRunner(list(argv), timeout=timeout, start_timeout=start_timeout, validate=True, cwd=cwd)
    ok = True
    try:
        try:
            info = runner.start()
        except RunnerUnavailable as exc:
            print(f"FAIL start: {exc}", file=out)
            return False
        print(f"ok   start: {json.dumps(info, ensure_ascii=False)}", file=out)
        for label, request in probe_requests():
            restarts = runner.restarts
            outcome = runner.render(request)
            # A restart means the client rejected the exchange (schema, seq, JSON, crash, timeout).
            if runner.restarts != restarts or (isinstance(outcome, Errored) and "failed to start" in outcome.message):
                ok = False
                print(f"FAIL {label}: {outcome.message}" + (f"\n     stderr: {outcome.detail[-500:]}" if getattr(outcome, "detail", "") else ""), file=out)
            else:
                shown = json.dumps(getattr(outcome, "text", None) or getattr(outcome, "message", None)
                                   or getattr(outcome, "reason", ""), ensure_ascii=False)
                print(f"ok   {label}: {outcome.kind} {shown[:120]}", file=out)
    finally:
        runner.close()
    print("conforms" if ok else "does NOT conform", file=out)
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runners.protocol.validate",
        description="Check a harness against the chatgold harness protocol schemas: validate.py -- <argv...>")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per render (default 20)")
    parser.add_argument("--start-timeout", type=float, default=60.0, help="seconds to answer start (default 60)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the harness command line, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the harness command line after --")
    return 0 if validate_harness(command, timeout=args.timeout, start_timeout=args.start_timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
