"""Conversation cases: one JSON file each under conformance/cases/, validated against case.schema.json."""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional

from runners.base import DEFAULT_NOW, RenderRequest

from conformance import PACKAGE_DIR

CASES_DIR = PACKAGE_DIR / "cases"
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "case.schema.json"


class CaseError(ValueError):
    """A case file is unreadable or invalid; the message names the file and the problem."""


@dataclass(frozen=True)
class Case:
    id: str
    description: str
    features: tuple
    messages: list
    tools: Optional[list] = None
    documents: Optional[list] = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    kwargs: dict = field(default_factory=dict)
    now: str = DEFAULT_NOW
    sequence: Optional[dict] = None
    path: Optional[str] = None

    def request(self, template: str, bos_token: Optional[str], eos_token: Optional[str],
                template_id: Optional[str] = None) -> RenderRequest:
        return RenderRequest(
            template=template, messages=self.messages, bos_token=bos_token, eos_token=eos_token,
            tools=self.tools, documents=self.documents, add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message, kwargs=self.kwargs, now=self.now,
            template_id=template_id, case_id=self.id,
        )

    def input_dict(self) -> dict:
        """The case as data (what test vectors and the service carry)."""
        data = {"id": self.id, "description": self.description, "features": list(self.features),
                "messages": self.messages, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, "kwargs": self.kwargs, "now": self.now}
        if self.tools is not None:
            data["tools"] = self.tools
        if self.documents is not None:
            data["documents"] = self.documents
        if self.sequence is not None:
            data["sequence"] = self.sequence
        return data


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def case_from_data(data: Any, source: str, expected_id: Optional[str] = None) -> Case:
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise CaseError(f"{source}: invalid case at {where}: {first.message}{more}")
    if expected_id is not None and data["id"] != expected_id:
        raise CaseError(f"{source}: case id {data['id']!r} does not match the file name {expected_id!r}")
    return Case(
        id=data["id"], description=data["description"], features=tuple(data["features"]),
        messages=data["messages"], tools=data.get("tools"), documents=data.get("documents"),
        add_generation_prompt=data.get("add_generation_prompt", False),
        continue_final_message=data.get("continue_final_message", False),
        kwargs=data.get("kwargs") or {}, now=data.get("now") or DEFAULT_NOW, sequence=data.get("sequence"),
        path=source,
    )


def load_case(path: Path | str, check_name: bool = True) -> Case:
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
    return case_from_data(data, str(path), path.stem if check_name else None)


def load_cases(directory: Path | str = CASES_DIR) -> list[Case]:
    cases = [load_case(p) for p in sorted(Path(directory).glob("*.json"))]
    return cases


def select_cases(cases: Iterable[Case], patterns: Optional[list[str]] = None,
                 features: Optional[list[str]] = None) -> list[Case]:
    selected = []
    for case in cases:
        if patterns and not any(fnmatch.fnmatchcase(case.id, p) for p in patterns):
            continue
        if features and not set(features) & set(case.features):
            continue
        selected.append(case)
    return selected
