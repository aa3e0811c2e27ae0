"""ggufdoctor 0.3.0's copy of Ollama's template index (server template matching, Ollama v0.33.2).

Ollama's `template/index.json` lists Hugging Face Jinja templates seen on real models, each with the name
of the Ollama Go template it maps to; ggufdoctor ships it with Ollama's MIT license and the pinned commit.
The Jinja text sits in a JSON string, so the template's bytes are the UTF-8 of that decoded string.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, PackageSource, SourceError
from conformance.corpus.sources._wheel import package_dir, read_json_list

SOURCE_ID = "ggufdoctor"
DATA_DIR = "ggufdoctor/ollama_data"
INDEX = f"{DATA_DIR}/index.json"


def _ollama_pin(root: Path) -> dict:
    pin = root / DATA_DIR / "OLLAMA_PIN"
    try:
        return json.loads(pin.read_text(encoding="utf-8")) if pin.exists() else {}
    except ValueError as exc:
        raise SourceError(f"{pin}: not valid JSON: {exc}") from exc


def _license(root: Path) -> str | None:
    text = (root / DATA_DIR / "LICENSE-ollama")
    if text.exists() and text.read_text(encoding="utf-8").lstrip().startswith("MIT License"):
        return "MIT"
    return None


def extract(root: Path) -> Iterator[Candidate]:
    index_path = package_dir(root, INDEX)
    index = read_json_list(index_path)
    pin = _ollama_pin(root)
    license_id = _license(root)
    seen: dict[str, int] = {}
    for position, entry in enumerate(index):
        if not isinstance(entry, dict) or not isinstance(entry.get("template"), str) \
                or not isinstance(entry.get("name"), str):
            raise SourceError(f"{index_path}#/{position}: expected {{'template': str, 'name': str}}")
        ollama_name = entry["name"]
        seen[ollama_name] = seen.get(ollama_name, 0) + 1
        yield Candidate(
            text=entry["template"].encode("utf-8"), source=SOURCE_ID, path=f"{INDEX}#/{position}/template",
            key=f"{position}/template", name=f"ollama-{ollama_name}-{seen[ollama_name]}", license=license_id,
            extra={"ollama_template": ollama_name, "ollama_release": pin.get("release"),
                   "ollama_commit": pin.get("commit")},
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="ggufdoctor", version="0.3.0", dist="wheel",
    sha256="ce27c263f206c5666554086081504f2c75cf1309bc3cc512f8d85047a369c398", extract=extract,
)
