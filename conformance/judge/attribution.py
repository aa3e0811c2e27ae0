"""Which template line and construct emitted the golden's first diverging byte.

The golden's cell is rendered again with the evaluator's byte provenance (render_traced) and the span covering
the offset names the line and construct. The traced output must equal the golden byte for byte, otherwise its
spans say nothing about it and the answer is {"unavailable": why}.

Templates are untrusted code, so the traced renders never run in the caller's process: they run in worker
processes (`python -m conformance.judge.attribution`, AttributionWorker) under the evaluator's memory cap, one
template per task, each task under a time limit. A worker that crashes, runs out of memory or time costs that
task's cells ({"unavailable": why}) and a restart, never the caller. A large batch (the gate's report: every
runner's diverged cells) is spread over one worker per CPU; the service keeps one warm worker.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pickle
import queue
import selectors
import struct
import subprocess
import sys
import threading
import time
from typing import Iterable, Optional

CONTEXT_LINES = 3  # template lines kept either side of an attributed line
# A task's time limit: compiling the template with tracing, then one traced render per cell, each under the
# evaluator's own limits (which answer first), plus slack for the worker's start.
TASK_BASE_SECONDS = 30.0
CELL_SECONDS = 12.0


def attribute_divergence(request, golden, offset: int, worker: Optional["AttributionWorker"] = None) -> dict:
    """{"line", "construct", "source_line"} for the golden byte at `offset`, or {"unavailable": why}; rendered
    in `worker` (a fresh one when none is given)."""
    task = (request.template, [(dataclasses.replace(request, template=""), golden, [offset])])
    own = worker is None
    worker = worker or AttributionWorker()
    try:
        return worker.run(task)[0][0]
    finally:
        if own:
            worker.close()


def attribute_results(pending: Iterable[tuple], processes: Optional[int] = None, store=None) -> None:
    """Set extra["attribution"] on diverged results, given as (CellResult, RenderRequest, Golden).

    One traced render per cell however many runners diverged there, and a template's cells one after another
    so its traced compile is reused (runners checked one after another would otherwise recompile it each).
    A large batch is spread over `processes` worker processes (default: one per CPU, at most one per task). With a result store
    (render/store.py), answers it holds for the same evaluator, cell, golden and offset are reused."""
    if store is not None:
        from conformance.render.store import cached_attributions

        return cached_attributions(list(pending), store, lambda missing: attribute_results(missing, processes))
    by_cell: dict = {}
    for result, request, golden in pending:
        by_cell.setdefault((result.template_id, result.case_id), []).append((result, request, golden))
    keys = sorted(by_cell)
    tasks, task_keys = [], []
    for _, group in itertools.groupby(keys, key=lambda key: key[0]):
        group = list(group)
        template = by_cell[group[0]][0][1].template
        # The template travels once per task, not once per cell.
        tasks.append((template, [(dataclasses.replace(by_cell[k][0][1], template=""), by_cell[k][0][2],
                                  [r.divergence.offset for r, _, _ in by_cell[k]]) for k in group]))
        task_keys.append(group)
    if not tasks:
        return
    answers = _in_workers(tasks, min(processes or os.cpu_count() or 1, len(tasks)))
    for group, per_cell in zip(task_keys, answers):
        for key, found in zip(group, per_cell):
            for (result, _, _), attribution in zip(by_cell[key], found):
                result.attribution = attribution


def attribute_diverged(results: Iterable, requests: dict, goldens, store=None) -> None:
    """Attribute every diverged result not attributed yet; requests: (template id, case id) -> RenderRequest,
    goldens: (template id, case id) -> Golden."""
    from conformance.judge.status import Status

    attribute_results([(r, requests[r.key], goldens(*r.key)) for r in results
                       if r.status == Status.DIVERGED and r.attribution is None], store=store)


def attribute_template(task: tuple) -> list:
    """One template's cells -> per cell, the attribution of each of its offsets."""
    template, cells = task
    answers = []
    for request, golden, offsets in cells:
        request = dataclasses.replace(request, template=template)
        traced = _trace(request, golden)
        answers.append([_locate(traced, request, golden, offset) for offset in offsets])
    return answers


def _in_workers(tasks: list, processes: int) -> list:
    """Every task's answers, in task order, from `processes` workers taking the biggest tasks first."""
    answers: list = [None] * len(tasks)
    work: "queue.SimpleQueue[int]" = queue.SimpleQueue()
    for index in sorted(range(len(tasks)), key=lambda i: -len(tasks[i][1])):
        work.put(index)

    def run() -> None:
        worker = AttributionWorker()
        try:
            while True:
                try:
                    index = work.get_nowait()
                except queue.Empty:
                    return
                answers[index] = worker.run(tasks[index])
        finally:
            worker.close()

    threads = [threading.Thread(target=run, name="attribution", daemon=True) for _ in range(max(1, processes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


class AttributionWorker:
    """One worker process, started on first use and kept warm: a task in (pickled, length-prefixed), its answers
    out (one JSON line). A crash, a memory error or a task over its time limit costs that task, whose cells
    answer {"unavailable": why}, and the process (a fresh one takes the next task)."""

    def __init__(self, nice: int = 0):
        self.nice = nice
        self.proc = None
        self._tag = None
        self._stderr = None
        self._lock = threading.Lock()

    def run(self, task: tuple) -> list:
        template, cells = task
        timeout = TASK_BASE_SECONDS + CELL_SECONDS * len(cells)
        with self._lock:
            try:
                self._ensure()
                payload = pickle.dumps(task)
                self.proc.stdin.write(struct.pack(">Q", len(payload)) + payload)
                self.proc.stdin.flush()
                line = self._read_line(timeout)
                answers = json.loads(line)
                if not isinstance(answers, list) or len(answers) != len(cells):
                    raise ValueError(f"worker answered {str(line[:200])!r}")
                return answers
            except Exception as exc:  # the worker failed on this template: its cells only, never the caller
                why = self._failure(exc)
                self.close()
                return [[{"unavailable": f"attribution unavailable: {why}"} for _ in offsets]
                        for _, _, offsets in cells]

    def _ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.close()
        from runners.command import StderrRing
        from runners.harness import python_harness
        from runners.proctree import tagged_env, track

        argv, env = python_harness("conformance.judge.attribution")
        env, self._tag = tagged_env(env)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)
        track(self.proc, self._tag)
        self._stderr = StderrRing(self.proc.stderr)
        if self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            except OSError:
                pass
        self._buffer = b""

    def _read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the worker gave no answer within {timeout:g} s")
                if not selector.select(remaining):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise EOFError("the worker exited")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _failure(self, exc: Exception) -> str:
        from runners.base import describe_exit

        if isinstance(exc, TimeoutError):
            return str(exc)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        status = describe_exit(self.proc.poll()) if self.proc is not None else "not started"
        tail = self._stderr.tail(300).strip().splitlines()[-1:] if self._stderr is not None else []
        return f"the worker failed ({status}{': ' + tail[0] if tail else ''})"

    def close(self) -> None:
        if self.proc is None:
            return
        from runners.proctree import kill_tree

        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        kill_tree(self.proc, self._tag)
        self.proc = None


def _trace(request, golden):
    """The evaluator's traced render of the cell, or {"unavailable": why}."""
    try:
        from runners.evaluator import ChatTemplate
    except Exception as exc:  # the evaluator is optional for checking; say so instead of guessing
        return {"unavailable": f"attribution unavailable: runners.evaluator cannot be imported ({exc})"}
    try:
        traced = ChatTemplate(request.template).render_traced(
            request.messages, tools=request.tools, documents=request.documents,
            add_generation_prompt=request.add_generation_prompt, bos_token=request.bos_token,
            eos_token=request.eos_token, kwargs=dict(request.kwargs), now=request.now,
            continue_final_message=request.continue_final_message)
    except Exception as exc:
        return {"unavailable": f"attribution unavailable: the evaluator's traced render failed: "
                               f"{type(exc).__name__}: {str(exc)[:200]}"}
    if traced.data != golden.data:
        return {"unavailable": "attribution unavailable: the evaluator's traced render differs from the golden"}
    return traced


def _locate(traced, request, golden, offset: int) -> dict:
    if isinstance(traced, dict):
        return dict(traced)
    from runners.evaluator import origin_at

    if offset >= len(golden.data):
        # The engine's output is longer than the golden: the golden ended; blame what emitted its last byte.
        if not golden.data:
            return {"unavailable": "attribution unavailable: the golden is empty (the engine emitted extra bytes)"}
        offset = len(golden.data) - 1
        at_end = True
    else:
        at_end = False
    try:
        span = origin_at(traced.spans, offset)
    except IndexError as exc:
        return {"unavailable": f"attribution unavailable: {exc}"}
    lines = request.template.splitlines()
    source_line = lines[span.lineno - 1] if 0 < span.lineno <= len(lines) else ""
    found = {"line": span.lineno, "construct": span.construct, "source_line": source_line[:400]}
    first = max(1, span.lineno - CONTEXT_LINES)
    found["context_first_line"] = first
    found["context"] = [line[:240] for line in lines[first - 1:span.lineno + CONTEXT_LINES]]
    if at_end:
        found["at_golden_end"] = True
    return found


def main() -> None:
    """Worker: length-prefixed pickled tasks on stdin, one JSON line of answers per task on stdout."""
    from runners.evaluator.runner import EVALUATOR_MEMORY_LIMIT
    from runners.harness import limit_memory

    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout = sys.stderr
    limit_memory(EVALUATOR_MEMORY_LIMIT)
    stdin = sys.stdin.buffer
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        task = pickle.loads(stdin.read(struct.unpack(">Q", header)[0]))
        try:
            answers = attribute_template(task)
        except MemoryError:
            answers = [[{"unavailable": "attribution unavailable: memory limit exceeded"} for _ in offsets]
                       for _, _, offsets in task[1]]
        out.write(json.dumps(answers, ensure_ascii=True).encode("ascii") + b"\n")


if __name__ == "__main__":
    main()
