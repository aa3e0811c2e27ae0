"""Axolotl 0.21.0's `chat_template` choices: copies of model templates plus a few formats it writes itself.

axolotl 0.21.0 declares Requires-Python >=3.12; we only download and unpack the wheel, never install it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, PackageSource
from conformance.corpus.sources._wheel import (
    GENERIC_FORMAT_NAMES,
    package_dir,
    wheel_license,
)

SOURCE_ID = "axolotl"
TEMPLATES_DIR = "axolotl/utils/chat_templates/templates"


def _variant(stem: str) -> str:
    for variant in ("tool_use", "rag"):
        if stem.endswith("_" + variant):
            return variant
    return "default"


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    for path in sorted(package_dir(root, TEMPLATES_DIR).glob("*.jinja")):
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{path.name}",
            name=f"axolotl-{path.stem}", variant=_variant(path.stem), license=license_id,
            generic=path.stem in GENERIC_FORMAT_NAMES,
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="axolotl", version="0.21.0", dist="wheel",
    sha256="5db0468897d1f3a80fa2becc80dd4409f378ce887dcb2c98854dc70b38196391", extract=extract,
)
