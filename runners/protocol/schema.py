"""The protocol's JSON Schemas (the *.schema.json files beside this module) and the checks of one message
against them: what `CommandRunner(argv, validate=True)` runs on every line it sends and receives.

Apart from validate.py (the shell check of a whole harness, which drives a CommandRunner), so that the runner
and the validator do not import each other."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

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
