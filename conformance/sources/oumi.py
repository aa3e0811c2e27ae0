"""Oumi 0.9's built-in chat templates (selected by name in its training configs)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import Candidate, PackageSource
from ._wheel import GENERIC_FORMAT_NAMES, package_dir, wheel_license

SOURCE_ID = "oumi"
TEMPLATES_DIR = "oumi/datasets/chat_templates"


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    for path in sorted(package_dir(root, TEMPLATES_DIR).glob("*.jinja")):
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{path.name}",
            name=f"oumi-{path.stem}", license=license_id, generic=path.stem in GENERIC_FORMAT_NAMES,
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="oumi", version="0.9", dist="wheel",
    sha256="607ee5223b5cfe9db1ba58f7a2fbdcac6e1f950db8875c4cfa03f0e2efb20e30", extract=extract,
)
