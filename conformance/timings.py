"""Per-stage wall and CPU seconds of a run, for benchmarks (benchmarks/bench_gate.py reads the gate's).

A stage is timed on the thread that runs it: wall by the clock, CPU by that thread's own CPU time
(time.thread_time), so stages running at once on different threads are each charged what they did. Work done
in engine processes is not in these figures (the benchmark samples those processes itself). Nothing here
decides a verdict: a run without a StageTimes times nothing.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional


class StageTimes:
    def __init__(self):
        self._lock = threading.Lock()
        self._times: dict = {}  # (stage, who) -> [wall, cpu, calls]

    @contextmanager
    def stage(self, stage: str, who: str = "") -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(stage, who, time.perf_counter() - wall, time.thread_time() - cpu)

    def add(self, stage: str, who: str, wall: float, cpu: float) -> None:
        with self._lock:
            row = self._times.setdefault((stage, who), [0.0, 0.0, 0])
            row[0] += wall
            row[1] += cpu
            row[2] += 1

    def as_dict(self) -> dict:
        """{"stages": [{stage, who, wall, cpu, calls}], "by_stage": {stage: {wall_max, wall_sum, cpu}}}:
        by_stage sums CPU over runners; wall_max is the longest single runner's (they run at once)."""
        with self._lock:
            rows = [{"stage": stage, "who": who, "wall": round(wall, 3), "cpu": round(cpu, 3), "calls": calls}
                    for (stage, who), (wall, cpu, calls) in sorted(self._times.items())]
        by_stage: dict = {}
        for row in rows:
            total = by_stage.setdefault(row["stage"], {"wall_max": 0.0, "wall_sum": 0.0, "cpu": 0.0})
            total["wall_max"] = round(max(total["wall_max"], row["wall"]), 3)
            total["wall_sum"] = round(total["wall_sum"] + row["wall"], 3)
            total["cpu"] = round(total["cpu"] + row["cpu"], 3)
        return {"stages": rows, "by_stage": by_stage}


def timed(times: Optional[StageTimes], stage: str, who: str = ""):
    """times.stage(stage, who), or a no-op without a StageTimes."""
    if times is None:
        from contextlib import nullcontext

        return nullcontext()
    return times.stage(stage, who)
