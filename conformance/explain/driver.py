"""Run many reductions at once: each step's candidates from every active reduction go to both runners as one
batch (`render_many`), the reference and the engine rendering at the same time on their own threads.

A reduction (reduce.Reduction.run) is a generator that yields lists of requests and is sent their (reference,
engine) outcome pairs; it returns its result. Interleaving keeps every worker process of both runners busy
without rendering anything a sequential reduction would not (no speculation).
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, deque
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
    memo_hits: int = 0         # requests answered by the run's memo (rendered before by another reduction)

    def to_dict(self) -> dict:
        return {"batches": self.batches, "renders": self.renders, "memo_hits": self.memo_hits,
                "reference_seconds": round(self.reference_seconds, 3),
                "engine_seconds": round(self.engine_seconds, 3), "wall_seconds": round(self.wall_seconds, 3)}


class PairMemo:
    """The (reference, engine) pairs of one run's candidates, by what decides them: template, special tokens
    and the conversation in its own key order. Sibling groups of one template reduce through many of the same
    candidates (the template with one node dropped, the probe, the smallest conversation); each is rendered
    once a run. A pair with a runner error is not kept (it may not happen again). Bounded: the least recently
    used pairs go first."""

    def __init__(self, max_entries: int = 50_000):
        self.max_entries = max_entries
        self._pairs: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(request) -> tuple:
        conversation = json.dumps(request.conversation.to_dict(), ensure_ascii=False, separators=(",", ":"))
        return (request.template, request.bos_token, request.eos_token, conversation)

    def get(self, key: tuple):
        with self._lock:
            pair = self._pairs.get(key)
            if pair is not None:
                self._pairs.move_to_end(key)
            return pair

    def put(self, key: tuple, pair: tuple) -> None:
        if any(isinstance(outcome, Errored) for outcome in pair):
            return
        with self._lock:
            self._pairs[key] = pair
            self._pairs.move_to_end(key)
            while len(self._pairs) > self.max_entries:
                self._pairs.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pairs)


def render_pairs(reference, engine, requests: list, stats: Optional[DriverStats] = None,
                 memo: Optional[PairMemo] = None) -> list:
    """(reference outcome, engine outcome) for each request, both runners rendering concurrently. With a
    `memo`, a request rendered before in the run (or twice in this list) is rendered once."""
    if not requests:
        return []
    if memo is None:
        return _render_both(reference, engine, requests, stats)
    keys = [PairMemo.key(request) for request in requests]
    known: dict = {}
    missing: dict = {}
    for key, request in zip(keys, requests):
        if key in known or key in missing:
            continue
        pair = memo.get(key)
        if pair is None:
            missing[key] = request
        else:
            known[key] = pair
    for key, pair in zip(missing, _render_both(reference, engine, list(missing.values()), stats)):
        known[key] = pair
        memo.put(key, pair)
    if stats is not None:
        stats.memo_hits += len(requests) - len(missing)
    return [known[key] for key in keys]


def _render_both(reference, engine, requests: list, stats: Optional[DriverStats] = None) -> list:
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
          failed: Optional[Callable[[object, Exception], object]] = None,
          memo: Optional[PairMemo] = None) -> dict:
    """Run (key, reduction) tasks to completion, up to `parallel` at a time; returns key -> result.
    `memo`: the run's memo of rendered pairs (a new one for this call when not given).

    `make(key, reduction)` may adjust a reduction just before it starts (hints from finished ones);
    `failed(key, exception)` gives the result of a reduction that raised (default: the exception)."""
    failed = failed or (lambda key, exc: exc)
    memo = PairMemo() if memo is None else memo
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
        pairs = render_pairs(reference, engine, batch, stats, memo)
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
