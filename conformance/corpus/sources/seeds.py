"""Seed templates users sent us, vendored in sources/vendored/ with their provenance (provenance.json).

A seed file is its original document name on the first line, then the template. Each file is verified
against the sha256 its provenance records, so the corpus builds from the repository alone.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, LocalSource, SourceError

SOURCE_ID = "vendored-seeds"
VENDORED_DIR = Path(__file__).resolve().parent / "vendored"
PROVENANCE = "provenance.json"


def _vendored_dir() -> Path:
    return VENDORED_DIR


def load_provenance(root: Path) -> dict:
    path = root / PROVENANCE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SourceError(f"{path}: missing (it lists the vendored seeds and their sha256)") from None
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    seeds = data.get("seeds") if isinstance(data, dict) else None
    if not isinstance(seeds, dict):
        raise SourceError(f"{path}: expected an object with a \"seeds\" object")
    return seeds


def extract(root: Path) -> Iterator[Candidate]:
    for file_name, record in sorted(load_provenance(root).items()):
        path = root / file_name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise SourceError(f"{path}: vendored seed missing (listed in {PROVENANCE})") from None
        digest = hashlib.sha256(raw).hexdigest()
        if digest != record.get("sha256"):
            raise SourceError(f"{path}: sha256 {digest} differs from {PROVENANCE}'s {record.get('sha256')}")
        _document_name, _, text = raw.partition(b"\n")
        yield Candidate(text=text, source=SOURCE_ID, path=file_name, name=record["name"], family=record.get("family"),
                        extra={"document": record.get("document"), "engine": record.get("engine")})


SOURCE = LocalSource(id=SOURCE_ID, description="seed documents from engines in the field, vendored in "
                     "conformance/corpus/sources/vendored (provenance.json)", extract=extract, root=_vendored_dir)
