"""Language-neutral test vectors: one JSON line per (template, case) cell, after a header line.

An engine in any language reads the file, renders each cell's template with the case's input, and compares
its bytes with `expected` — no chatgold needed. Format: docs/vectors.md; schema: schemas/vector.schema.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from conformance import PACKAGE_DIR
from conformance.judge.goldens import read_golden, read_meta

VECTOR_FORMAT = 1
SCHEMA_ID = "https://chatgold.invalid/schemas/vector.schema.json"


def dumps_line(record: dict) -> str:
    """One JSON line; lone surrogates (kept byte-exact in goldens) force \\u escapes for that line only."""
    try:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def cell_record(entry, case, golden, source: str) -> dict:
    expected = {"kind": golden.kind, "text": golden.text, "bytes": len(golden.data),
                "sha256": hashlib.sha256(golden.data).hexdigest()}
    return {"record": "cell",
            "template": {"id": entry.id, "sha256": entry.sha256, "family": entry.family, "source": source,
                         "bos_token": entry.bos_token, "eos_token": entry.eos_token},
            "case": case.to_dict(),
            "expected": expected}


def export_vectors(out: Path, templates: list, cases: list, goldens_root: Optional[Path] = None,
                   progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Write the vectors file atomically; returns the header record (with the counts)."""
    present, missing = [], []
    for entry in templates:
        for case in cases:
            golden = read_golden(entry.id, case.id, goldens_root)
            (present if golden is not None else missing).append((entry, case))
    header = {"record": "header", "format": VECTOR_FORMAT, "schema": SCHEMA_ID,
              "reference": {k: str(v) for k, v in read_meta(goldens_root).items()},
              "cells": len(present), "templates": len({e.id for e, _ in present}),
              "cases": len({c.id for _, c in present}),
              "missing_goldens": [f"{e.id}/{c.id}" for e, c in missing][:1000]}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    sources: dict = {}
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(dumps_line(header) + "\n")
            for index, (entry, case) in enumerate(present, 1):
                if entry.id not in sources:
                    sources.clear()  # cells come grouped by template: keep one source in memory
                    sources[entry.id] = entry.source()
                golden = read_golden(entry.id, case.id, goldens_root)
                fh.write(dumps_line(cell_record(entry, case, golden, sources[entry.id])) + "\n")
                if progress:
                    progress(index, len(present))
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return header


def schema_path() -> Path:
    return PACKAGE_DIR / "schemas" / "vector.schema.json"

