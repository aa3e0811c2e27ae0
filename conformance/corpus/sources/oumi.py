"""Oumi 0.9's built-in chat templates (selected by name in its training configs)."""
from __future__ import annotations

from conformance.corpus.sources import PackageSource
from conformance.corpus.sources._wheel import jinja_folder

SOURCE_ID = "oumi"
TEMPLATES_DIR = "oumi/datasets/chat_templates"

SOURCE = PackageSource(
    id=SOURCE_ID, package="oumi", version="0.9", dist="wheel",
    sha256="607ee5223b5cfe9db1ba58f7a2fbdcac6e1f950db8875c4cfa03f0e2efb20e30",
    extract=jinja_folder(SOURCE_ID, TEMPLATES_DIR, "oumi"),
)
