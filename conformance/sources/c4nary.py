"""c4nary 0.3.1's reference templates (`known_templates/`), which it compares GGUF templates against."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import Candidate, PackageSource
from ._wheel import GENERIC_FORMAT_NAMES, package_dir, wheel_license

SOURCE_ID = "c4nary"
TEMPLATES_DIR = "c4nary/known_templates"


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    for path in sorted(package_dir(root, TEMPLATES_DIR).glob("*.jinja")):
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{path.name}",
            name=f"c4nary-{path.stem}", license=license_id, generic=path.stem in GENERIC_FORMAT_NAMES,
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="c4nary", version="0.3.1", dist="wheel",
    sha256="635ee6525b1539714e83c9b507874d05a209a0a8abc45c8959bf57f6b6e0f1bc", extract=extract,
)
