"""The matrix: every selected template x every selected case, as render requests."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Iterator

from runners.base import RenderRequest


@dataclass(frozen=True)
class Cell:
    template: object  # corpus.TemplateEntry
    case: object      # cases.Case
    request: RenderRequest

    @property
    def key(self) -> str:
        return f"{self.template.id}/{self.case.id}"


def iter_cells(templates: Iterable, cases: Iterable) -> Iterator[Cell]:
    cases = list(cases)
    for template in templates:
        source = template.source()
        for case in cases:
            yield Cell(template, case, case.request(source, template.bos_token, template.eos_token, template.id))


def shard_of(key: str, count: int) -> int:
    """Deterministic shard for a cell key: stable across machines and Python runs (no hash randomisation)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % count


def select_shard(cells: Iterable[Cell], index: int, count: int) -> list[Cell]:
    """Cells of shard `index` (1-based) of `count`. Whole templates stay together so engines start once."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: index must be between 1 and {count}")
    return [c for c in cells if shard_of(c.template.id, count) == index - 1]
