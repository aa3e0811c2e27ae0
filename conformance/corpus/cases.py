"""Conversation cases: one JSON file each under conformance/cases/, validated against case.schema.json."""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from conformance import PACKAGE_DIR
from runners.base import Conversation, RenderRequest

CASES_DIR = PACKAGE_DIR / "cases"
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "case.schema.json"
# How deeply a case's JSON may nest (the deepest real case: under 10). Deeper input is refused when loaded:
# engines recurse over it (HF's own preprocessing fails near 900 levels; harnesses in other languages may
# crash), and a case is a conversation, not a stress test of the JSON parser.
MAX_CASE_DEPTH = 64


class CaseError(ValueError):
    """A case file is unreadable or invalid; the message names the file and the problem."""


@dataclass(frozen=True)
class Case:
    """A conversation with its metadata: id, description, the features the report rolls up by (test262
    style), and for step-by-step conversations the sequence it belongs to."""

    id: str
    description: str
    features: tuple
    conversation: Conversation
    sequence: Optional[dict] = None
    path: Optional[str] = None

    def request(self, template: str, bos_token: Optional[str], eos_token: Optional[str],
                template_id: Optional[str] = None) -> RenderRequest:
        return RenderRequest(template, self.conversation, bos_token, eos_token, template_id, self.id)

    def to_dict(self) -> dict:
        """The case as data (what test vectors and the service carry); absent tools/documents stay absent,
        as in the case file."""
        data = {"id": self.id, "description": self.description, "features": list(self.features),
                **self.conversation.to_dict()}
        for name in ("tools", "documents"):
            if data[name] is None:
                del data[name]
        if self.sequence is not None:
            data["sequence"] = self.sequence
        return data


def _validator(minimal: bool = False):
    from conformance import schema_validator

    return schema_validator("conversation.schema.json" if minimal else "case.schema.json", formats=True)


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply `value` nests (lists and objects), counting up to `limit + 1` without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def case_from_data(data: Any, source: str, expected_id: Optional[str] = None, minimal: bool = False) -> Case:
    """A Case from parsed JSON. `minimal`: only the conversation is required (`messages` and what the render
    needs; a `now` without an offset is read as UTC); id, description and features are optional."""
    if nesting_depth(data, MAX_CASE_DEPTH) > MAX_CASE_DEPTH:
        raise CaseError(f"{source}: the case nests deeper than {MAX_CASE_DEPTH} levels of lists/objects")
    errors = sorted(_validator(minimal).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise CaseError(f"{source}: invalid case at {where}: {first.message}{more}")
    if expected_id is not None and data["id"] != expected_id:
        raise CaseError(f"{source}: case id {data['id']!r} does not match the file name {expected_id!r}")
    try:
        conversation = Conversation.from_dict(data)
    except ValueError as exc:  # a `now` that is not a date and time
        raise CaseError(f"{source}: invalid case: {exc}") from None
    return Case(id=data.get("id") or Path(source).stem, description=data.get("description", ""),
                features=tuple(data.get("features", ())), conversation=conversation, sequence=data.get("sequence"),
                path=source)


def load_case(path: Path | str, check_name: bool = True, minimal: bool = False) -> Case:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CaseError(f"{path}: cannot read case file: {exc.strerror or exc}") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CaseError(f"{path}: case file is not UTF-8 (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise CaseError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except RecursionError:
        raise CaseError(f"{path}: the case nests too deeply to parse (the limit is {MAX_CASE_DEPTH} levels of "
                        f"lists/objects)") from None
    return case_from_data(data, str(path), path.stem if check_name else None, minimal)


def load_cases(directory: Path | str = CASES_DIR) -> list[Case]:
    cases = [load_case(p) for p in sorted(Path(directory).glob("*.json"))]
    return cases


def select_cases(cases: Iterable[Case], patterns: Optional[list[str]] = None,
                 features: Optional[list[str]] = None) -> list[Case]:
    selected = []
    for case in cases:
        if patterns and not any(fnmatch.fnmatchcase(case.id.lower(), p.lower()) for p in patterns):
            continue
        if features and not set(features) & set(case.features):
            continue
        selected.append(case)
    return selected
