"""Give llama-server mimalloc instead of glibc's malloc (LD_PRELOAD), from the PyPI `cmeel-mimalloc` wheel.

llama.cpp's Jinja engine allocates and frees small objects all the time: with glibc malloc, malloc/free were
about a third of llama-server's profile, and preloading mimalloc cut its CPU per request by about 30%
(benchmarks/bench_llamacpp.py, measured side by side). The allocator cannot change what a template renders.
CHATGOLD_LLAMACPP_MALLOC=system keeps glibc's.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Optional

DISTRIBUTION = "cmeel-mimalloc"
LIBRARY = "cmeel.prefix/lib/libmimalloc.so.3"


@lru_cache(maxsize=1)
def find_mimalloc() -> Optional[Path]:
    if os.environ.get("CHATGOLD_LLAMACPP_MALLOC", "mimalloc") == "system":
        return None
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution(DISTRIBUTION).locate_file(LIBRARY))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


def allocator_name() -> str:
    if find_mimalloc() is None:
        return "glibc malloc"
    from importlib.metadata import version

    return f"mimalloc ({DISTRIBUTION} {version(DISTRIBUTION)})"
