"""Run many reductions at once: each step's candidates from every active reduction go to both runners as one
batch (`render_many`), the reference and the engine rendering at the same time on their own threads.

A reduction (reduce.Reduction.run) is a generator that yields lists of requests and is sent their (reference,
engine) outcome pairs; it returns its result. Interleaving keeps every worker process of both runners busy
without rendering anything a sequential reduction would not (no speculation).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from runners.base import Errored


@dataclass
class DriverStats:
    batches: int = 0
    renders: int = 0           # requests rendered through each runner
    reference_seconds: float = 0.0
    engine_seconds: float = 0.0
    wall_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"batches": self.batches, "renders": self.renders,
                "reference_seconds": round(self.reference_seconds, 3),
                "engine_seconds": round(self.engine_seconds, 3), "wall_seconds": round(self.wall_seconds, 3)}


def render_pairs(reference, engine, requests: list, stats: Optional[DriverStats] = None) -> list:
    """(reference outcome, engine outcome) for each request, both runners rendering concurrently."""
    if not requests:
        return []
    results: dict = {}

    def run(name: str, runner) -> None:
        started = time.perf_counter()
        try:
            results[name] = list(runner.render_many(requests))
        except Exception as exc:  # a runner bug costs these candidates, never the explanation
            results[name] = [Errored(f"{type(exc).__name__}: {exc}")] * len(requests)
        if stats is not None:
            if name == "reference":
                stats.reference_seconds += time.perf_counter() - started
            else:
                stats.engine_seconds += time.perf_counter() - started

    other = threading.Thread(target=run, args=("reference", reference), daemon=True)
    other.start()
    run("engine", engine)
    other.join()
    if stats is not None:
        stats.batches += 1
        stats.renders += len(requests)
    return list(zip(results["reference"], results["engine"]))


@dataclass
class _Active:
    key: object
    steps: object          # the generator
    pending: list = field(default_factory=list)


def drive(tasks: Iterable[tuple], reference, engine, parallel: int = 24,
          on_done: Optional[Callable[[object, object], None]] = None,
          stats: Optional[DriverStats] = None, make: Optional[Callable] = None,
          failed: Optional[Callable[[object, Exception], object]] = None) -> dict:
    """Run (key, reduction) tasks to completion, up to `parallel` at a time; returns key -> result.

    `make(key, reduction)` may adjust a reduction just before it starts (hints from finished ones);
    `failed(key, exception)` gives the result of a reduction that raised (default: the exception)."""
    failed = failed or (lambda key, exc: exc)
    started = time.perf_counter()
    queue = deque(tasks)
    active: list[_Active] = []
    results: dict = {}

    def start_more() -> None:
        while queue and len(active) < parallel:
            key, reduction = queue.popleft()
            if make is not None:
                make(key, reduction)
            steps = reduction.run()
            entry = _Active(key, steps)
            if _advance(entry, None):
                active.append(entry)

    def _advance(entry: _Active, sent) -> bool:
        """Send `sent` (None to start) and keep the next request list; False when the reduction is done."""
        try:
            entry.pending = entry.steps.send(sent)
            return True
        except StopIteration as stop:
            value = stop.value
        except Exception as exc:  # a reducer bug costs this group (its cells are unexplained), never the run
            value = failed(entry.key, exc)
        results[entry.key] = value
        if on_done is not None:
            on_done(entry.key, value)
        return False

    start_more()
    while active:
        batch = [request for entry in active for request in entry.pending]
        pairs = render_pairs(reference, engine, batch, stats)
        offset, still = 0, []
        for entry in active:
            mine = pairs[offset:offset + len(entry.pending)]
            offset += len(entry.pending)
            if _advance(entry, mine):
                still.append(entry)
        active[:] = still
        start_more()
    if stats is not None:
        stats.wall_seconds += time.perf_counter() - started
    return results
