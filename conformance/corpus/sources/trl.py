"""TRL 1.16.0's chat templates: model templates kept for identity comparison, and `_training` patches.

The `_training` files add `{% generation %}` markers (assistant-only loss) and prefix-preserving fixes, so
they are variant "training" of the template they patch. The package README names, per file, the model
repo it was taken from ("as shipped by `org/model`"); those repos become aliases.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, PackageSource
from conformance.corpus.sources._wheel import (
    GENERIC_FORMAT_NAMES,
    package_dir,
    wheel_license,
)

SOURCE_ID = "trl"
TEMPLATES_DIR = "trl/chat_templates"

_SECTION = re.compile(r"^### (.+)$", re.M)
_FILE = re.compile(r"`([A-Za-z0-9_.-]+)\.jinja`")
_REPO = re.compile(r"`([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)`")


def readme_repos(readme_text: str) -> dict[str, list[str]]:
    """File stem -> model repos the README says ship it (sections may head several files)."""
    found: dict[str, list[str]] = {}
    sections = _SECTION.split(readme_text)
    # split() yields [preamble, heading1, body1, heading2, body2, ...]
    for heading, body in zip(sections[1::2], sections[2::2]):
        repos = [r for r in _REPO.findall(body) if not r.endswith(".jinja")]
        for stem in _FILE.findall(heading):
            found[stem] = list(dict.fromkeys(repos))
    return found


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    templates_dir = package_dir(root, TEMPLATES_DIR)
    readme = templates_dir / "README.md"
    repos = readme_repos(readme.read_text(encoding="utf-8")) if readme.exists() else {}
    for path in sorted(templates_dir.glob("*.jinja")):
        stem = path.stem
        training = stem.endswith("_training")
        base = stem[: -len("_training")] if training else stem
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{path.name}", name=f"trl-{stem}",
            aliases=repos.get(base, []) if not training else [], variant="training" if training else "default",
            license=license_id, generic=base in GENERIC_FORMAT_NAMES,
            extra={"patches": f"{TEMPLATES_DIR}/{base}.jinja"} if training else {},
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="trl", version="1.16.0", dist="wheel",
    sha256="c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396", extract=extract,
)
