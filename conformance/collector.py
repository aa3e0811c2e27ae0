"""The cyclic garbage collector's pace while a check runs.

What a check makes (outcomes, judged results, the goldens read) lives until the run reports, and holds next to no
cycles, so Python's default pace (a young collection every 700 allocations, old ones walking the whole heap)
spends its time walking data that will never be garbage. While a check runs, young objects are still collected,
only less often, and the old ones are left alone. The thresholds are process-wide, so nested and concurrent
checks (the gate runs several runners at once) share one setting, restored when the last of them ends.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

# (young, middle, old): a young collection every million allocations, an old one in practice never.
CHECK_THRESHOLDS = (1_000_000, 50, 1000)

_lock = threading.Lock()
_depth = 0
_saved: tuple = ()


def hold_collections() -> None:
    """Enter the check's pace (counted: each call needs one release_collections)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*CHECK_THRESHOLDS)
        _depth += 1


def release_collections() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0:
            gc.set_threshold(*_saved)


@contextmanager
def few_collections() -> Iterator[None]:
    hold_collections()
    try:
        yield
    finally:
        release_collections()
