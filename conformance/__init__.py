"""chatgold: conformance suite and golden files for LLM chat templates."""
from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout holding templates/ and goldens/ (overridable with CHATGOLD_ROOT)."""
    import os

    env = os.environ.get("CHATGOLD_ROOT")
    if env:
        return Path(env).resolve()
    return PACKAGE_DIR.parent
