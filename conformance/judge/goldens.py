"""Byte-exact goldens: goldens/<template-id>/<case-id>.txt, or <case-id>.raised.txt for a reference refusal.

Only the reference runner produces goldens. Every write is atomic (temporary file + rename), so an update
killed midway leaves each golden either old or new, never partial.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance import repo_root
from runners.base import Errored, Outcome, Raised, Rendered, Skipped

META_FILE = "_meta.json"
RENDERED_SUFFIX = ".txt"
RAISED_SUFFIX = ".raised.txt"
CAPABILITIES_FILE = "capabilities.json"
PROPERTIES_FILE = "properties.json"
# Bytes a template can legitimately emit include lone surrogates smuggled in through JSON; keep them exact.
ENCODING_ERRORS = "surrogatepass"


def goldens_dir() -> Path:
    return repo_root() / "goldens"


@dataclass(frozen=True)
class Golden:
    kind: str  # "rendered" or "raised"
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", ENCODING_ERRORS)

    @property
    def raised(self) -> bool:
        return self.kind == "raised"


def cell_paths(template_id: str, case_id: str, root: Optional[Path] = None) -> tuple[Path, Path]:
    base = (root or goldens_dir()) / template_id
    return base / f"{case_id}{RENDERED_SUFFIX}", base / f"{case_id}{RAISED_SUFFIX}"


def golden_bytes(outcome: Outcome) -> tuple[str, bytes]:
    if isinstance(outcome, Rendered):
        return "rendered", outcome.text.encode("utf-8", ENCODING_ERRORS)
    if isinstance(outcome, Raised):
        return "raised", outcome.message.encode("utf-8", ENCODING_ERRORS)
    raise ValueError(f"a {outcome.kind} outcome cannot be a golden")


def read_golden(template_id: str, case_id: str, root: Optional[Path] = None) -> Optional[Golden]:
    # Plain strings and one open per kind: this runs once per cell per runner, so pathlib's cost showed.
    base = os.path.join(root or goldens_dir(), template_id, case_id)
    for kind, suffix in (("rendered", RENDERED_SUFFIX), ("raised", RAISED_SUFFIX)):
        try:
            with open(base + suffix, "rb") as handle:
                return Golden(kind, handle.read())
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


class GoldenStore:
    """Goldens read once and then shared: the gate checks every runner against the same cells.

    Safe to call from several threads (a race costs one duplicate read, never a wrong answer)."""

    def __init__(self, root: Optional[Path] = None):
        self.root = root
        self._cache: dict = {}

    def __call__(self, template_id: str, case_id: str) -> Optional[Golden]:
        key = (template_id, case_id)
        try:
            return self._cache[key]
        except KeyError:
            golden = self._cache[key] = read_golden(template_id, case_id, self.root)
            return golden


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _umask_mode()


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp creates 0600; goldens are ordinary readable files
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_golden(template_id: str, case_id: str, outcome: Outcome, root: Optional[Path] = None) -> bool:
    """Store the reference outcome; returns True when anything on disk changed."""
    kind, data = golden_bytes(outcome)
    rendered, raised = cell_paths(template_id, case_id, root)
    target, other = (rendered, raised) if kind == "rendered" else (raised, rendered)
    changed = False
    if not target.exists() or target.read_bytes() != data:
        atomic_write(target, data)
        changed = True
    if other.exists():
        other.unlink()
        changed = True
    return changed


def expected_paths(template_ids: Iterable[str], case_ids: Iterable[str], root: Optional[Path] = None) -> dict:
    """template dir -> allowed file names (both variants of every cell, plus the analysis goldens)."""
    case_ids = list(case_ids)
    names = {f"{c}{RENDERED_SUFFIX}" for c in case_ids} | {f"{c}{RAISED_SUFFIX}" for c in case_ids}
    names.update((CAPABILITIES_FILE, PROPERTIES_FILE))
    return {t: names for t in template_ids}


def find_orphans(template_ids: Iterable[str], case_ids: Iterable[str], root: Optional[Path] = None) -> list[Path]:
    """Golden files that no (template, case) pair produces, and stray files of interrupted writes."""
    root = root or goldens_dir()
    allowed = expected_paths(template_ids, case_ids, root)
    orphans = []
    if not root.exists():
        return orphans
    for child in sorted(root.iterdir()):
        if child.name == META_FILE:
            continue
        if not child.is_dir() or child.name not in allowed:
            orphans.append(child)
            continue
        names = allowed[child.name]
        present = {p.name for p in child.iterdir()}
        for path in sorted(child.iterdir()):
            # A cell is either rendered or raised: a second variant beside the first is stale.
            stale_raised = path.name.endswith(RAISED_SUFFIX) and path.name[:-len(RAISED_SUFFIX)] + RENDERED_SUFFIX in present
            if path.name not in names or stale_raised:
                orphans.append(path)
    return orphans


def encode_record(record: dict) -> bytes:
    """An analysis golden (capabilities.json, properties.json) in canonical form."""
    return (json.dumps(record, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8", ENCODING_ERRORS)


def load_record(path: Path) -> Optional[dict]:
    """An analysis golden, or None when there is none; ValueError naming the file when it is not JSON."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors=ENCODING_ERRORS))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def read_meta(root: Optional[Path] = None) -> dict:
    path = (root or goldens_dir()) / META_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def write_meta(meta: dict, root: Optional[Path] = None) -> None:
    path = (root or goldens_dir()) / META_FILE
    data = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()
    if not path.exists() or path.read_bytes() != data:
        atomic_write(path, data)


@dataclass
class UpdateReport:
    cells: int = 0
    written: int = 0
    removed: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # (template, case, message)

    @property
    def ok(self) -> bool:
        return not self.failures


def update_goldens(corpus, cases, runner, root: Optional[Path] = None, prune: bool = True,
                   progress: Optional[Callable[[int, int], None]] = None, full: bool = True) -> UpdateReport:
    """Render every (template, case) through the reference runner and store the outcomes.

    A cell the reference cannot produce (runner error, skip) is a failure: no golden is written for it and
    the old one is kept. `full` means the selection is the whole matrix, so orphans may be pruned.
    """
    from conformance.judge.pipeline import iter_cells

    report = UpdateReport()
    root = root or goldens_dir()
    cells = list(iter_cells(corpus, cases))
    total = len(cells)
    requests = [cell.request for cell in cells]
    for index, (cell, outcome) in enumerate(zip(cells, runner.render_many(requests)), 1):
        report.cells += 1
        if isinstance(outcome, (Errored, Skipped)):
            detail = outcome.message
            report.failures.append((cell.template.id, cell.case.id, f"{outcome.kind}: {detail}"))
        elif write_golden(cell.template.id, cell.case.id, outcome, root):
            report.written += 1
        if progress:
            progress(index, total)
    if prune and full:
        for orphan in find_orphans([t.id for t in corpus], [c.id for c in cases], root):
            if orphan.is_dir():
                import shutil

                shutil.rmtree(orphan)
            else:
                orphan.unlink()
            report.removed.append(str(orphan))
    return report


def reference_versions() -> dict:
    from runners.hf import transformers_versions

    return {**transformers_versions(), "python_runner": "runners.hf", "note": "goldens are byte-exact outputs of these versions"}
