"""Templates our users sent us (../shared/seeds): a seed file is its file name on the first line, then the text."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from conformance import repo_root
from conformance.corpus.sources import Candidate, LocalSource

SEED_TEMPLATES = {
    # seed file -> (name, family)
    "004_1418f49cfc42931e.txt": ("custom-llama3-seed004", "llama3"),
}


def _seeds_dir() -> Path:
    return repo_root().parent / "shared" / "seeds"


def extract(root: Path) -> Iterator[Candidate]:
    for file_name, (name, family) in SEED_TEMPLATES.items():
        path = root / file_name
        if not path.exists():
            raise FileNotFoundError(f"{path}: seed template missing (expected the shared folder beside the repo)")
        raw = path.read_bytes()
        _first_line, _, text = raw.partition(b"\n")
        yield Candidate(text=text, source="shared-seeds", path=f"shared/seeds/{file_name}", name=name, family=family)


SOURCE = LocalSource(id="shared-seeds", description="shared/seeds documents from engines in the field",
                     extract=extract, root=_seeds_dir)
