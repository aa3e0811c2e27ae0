"""Language-neutral test vectors: one JSON line per (template, case) cell, after a header line.

An engine in any language reads the file, renders each cell's template with the case's input as
runners/protocol/SEMANTICS.md says, and compares its bytes with `expected` -- no chatgold needed. Format:
docs/vectors.md; schema: schemas/vector.schema.json.

The output is a pure function of the goldens, the corpus and the cases: no timestamps, corpus order x case
order, and a `.gz` file is written with a zero mtime and no file name, so two exports are byte-identical (a
release can publish its sha256).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path
from typing import Callable, Optional

from conformance import PACKAGE_DIR, __version__
from conformance.files import atomic_file
from conformance.judge.goldens import cell_paths, read_golden, read_meta
from runners.base import SEMANTICS_VERSION

VECTOR_FORMAT = 2
SCHEMA_ID = "https://chatgold.invalid/schemas/vector.schema.json"
# What the expected values follow, named by release (a reader outside the repository has no path to open).
SEMANTICS = f"SEMANTICS.md of chatgold {__version__} (rules version {SEMANTICS_VERSION})"


def dumps_line(record: dict) -> str:
    """One JSON line; lone surrogates (kept byte-exact in goldens) force \\u escapes for that line only."""
    try:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def reference_versions(goldens_root: Optional[Path] = None) -> dict:
    """The versions every golden comes from (goldens/_meta.json without its prose)."""
    return {k: str(v) for k, v in sorted(read_meta(goldens_root).items()) if k not in ("note", "python_runner")}


def expected_record(golden) -> dict:
    expected = {"kind": golden.kind, "text": golden.text, "bytes": len(golden.data),
                "sha256": hashlib.sha256(golden.data).hexdigest()}
    if golden.raised:
        refusal = golden.refusal
        expected["refusal"] = {"kind": str(refusal.kind), "type": refusal.type_name, "message": refusal.message}
    return expected


def case_record(case) -> dict:
    """The case's labels and every conversation field (tools/documents null when absent: SEMANTICS.md R7, R8)."""
    record = {"id": case.id, "description": case.description, "features": list(case.features)}
    if case.sequence is not None:
        record["sequence"] = case.sequence
    record.update(case.conversation.to_dict())
    return record


def cell_record(entry, case, golden, source: str, bindings: bool = False) -> dict:
    record = {"record": "cell",
              "template": {"id": entry.id, "sha256": entry.sha256, "family": entry.family, "source": source,
                           "bos_token": entry.bos_token, "eos_token": entry.eos_token},
              "case": case_record(case)}
    if bindings:
        from runners.semantics import reference_bindings

        record["bindings"] = reference_bindings(case.request(source, entry.bos_token, entry.eos_token))
    record["expected"] = expected_record(golden)
    return record


def _open_output(path: Path, raw) -> io.TextIOWrapper:
    if path.name.endswith(".gz"):
        # No file name and mtime 0 in the gzip header: the bytes depend on the content only.
        return io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9),
                                encoding="utf-8", newline="\n")
    return io.TextIOWrapper(raw, encoding="utf-8", newline="\n")


def export_vectors(out: Path, templates: list, cases: list, goldens_root: Optional[Path] = None,
                   progress: Optional[Callable[[int, int], None]] = None, bindings: bool = False) -> dict:
    """Write the vectors file atomically (gzip when `out` ends in .gz); returns the header record."""
    present, missing = [], []
    for entry in templates:
        for case in cases:
            exists = any(path.exists() for path in cell_paths(entry.id, case.id, goldens_root))
            (present if exists else missing).append((entry, case))
    header = {"record": "header", "format": VECTOR_FORMAT, "schema": SCHEMA_ID, "semantics": SEMANTICS,
              "reference": reference_versions(goldens_root),
              "cells": len(present), "templates": len({e.id for e, _ in present}),
              "cases": len({c.id for _, c in present}), "bindings": bindings,
              "missing_goldens": [f"{e.id}/{c.id}" for e, c in missing][:1000]}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sources: dict = {}
    with atomic_file(out) as raw:
        with _open_output(out, raw) as fh:
            fh.write(dumps_line(header) + "\n")
            for index, (entry, case) in enumerate(present, 1):
                if entry.id not in sources:
                    sources.clear()  # cells come grouped by template: keep one source in memory
                    sources[entry.id] = entry.source()
                golden = read_golden(entry.id, case.id, goldens_root)
                if golden is None:
                    raise FileNotFoundError(f"the golden of {entry.id}/{case.id} disappeared during the export")
                fh.write(dumps_line(cell_record(entry, case, golden, sources[entry.id], bindings)) + "\n")
                if progress:
                    progress(index, len(present))
    return header


def schema_path() -> Path:
    return PACKAGE_DIR / "schemas" / "vector.schema.json"
