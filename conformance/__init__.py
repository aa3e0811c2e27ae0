"""chatgold: conformance suite and golden files for LLM chat templates."""
from functools import lru_cache
from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout holding templates/ and goldens/ (overridable with CHATGOLD_ROOT)."""
    import os

    env = os.environ.get("CHATGOLD_ROOT")
    return _resolved(env) if env else PACKAGE_DIR.parent


@lru_cache(maxsize=8)
def _resolved(path: str) -> Path:
    # Every golden path starts here: resolving (a syscall per component) once per value, not per cell.
    return Path(path).resolve()
