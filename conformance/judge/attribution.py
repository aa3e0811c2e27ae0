"""Which template line and construct emitted the golden's first diverging byte.

The golden's cell is rendered again with the evaluator's byte provenance (render_traced) and the span covering
the offset names the line and construct. The traced output must equal the golden byte for byte, otherwise its
spans say nothing about it and the answer is {"unavailable": why}.

A large batch (the gate's report: every runner's diverged cells) runs in worker processes, one template per
task: `python -m conformance.judge.attribution` reads pickled tasks on stdin and writes pickled answers on stdout.
Plain subprocesses rather than multiprocessing, whose spawn mode re-imports the caller's main module.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import subprocess
import sys
import threading
import warnings
from typing import Iterable, Optional

# Below this many cells, starting worker processes costs more than it saves.
PARALLEL_MIN_CELLS = 2000
CONTEXT_LINES = 3  # template lines kept either side of an attributed line


def attribute_divergence(request, golden, offset: int) -> dict:
    """{"line", "construct", "source_line"} for the golden byte at `offset`, or {"unavailable": why}."""
    return _locate(_trace(request, golden), request, golden, offset)


def attribute_results(pending: Iterable[tuple], processes: Optional[int] = None, store=None) -> None:
    """Set extra["attribution"] on diverged results, given as (CellResult, RenderRequest, Golden).

    One traced render per cell however many runners diverged there, and a template's cells one after another
    so its traced compile is reused (runners checked one after another would otherwise recompile it each).
    A large batch is spread over `processes` worker processes (default: one per CPU). With a result store
    (judge/store.py), answers it holds for the same evaluator, cell, golden and offset are reused."""
    if store is not None:
        from conformance.judge.store import cached_attributions

        return cached_attributions(list(pending), store, lambda missing: attribute_results(missing, processes))
    by_cell: dict = {}
    for result, request, golden in pending:
        by_cell.setdefault((result.template_id, result.case_id), []).append((result, request, golden))
    keys = sorted(by_cell)
    processes = processes or os.cpu_count() or 1
    tasks, task_keys = [], []
    for _, group in itertools.groupby(keys, key=lambda key: key[0]):
        group = list(group)
        template = by_cell[group[0]][0][1].template
        # The template travels once per task, not once per cell.
        tasks.append((template, [(dataclasses.replace(by_cell[k][0][1], template=""), by_cell[k][0][2],
                                  [r.divergence.offset for r, _, _ in by_cell[k]]) for k in group]))
        task_keys.append(group)
    if processes > 1 and len(keys) >= PARALLEL_MIN_CELLS:
        answers = _in_workers(tasks, processes)
    else:
        answers = [attribute_template(task) for task in tasks]
    for group, per_cell in zip(task_keys, answers):
        for key, found in zip(group, per_cell):
            for (result, _, _), attribution in zip(by_cell[key], found):
                result.extra["attribution"] = attribution


def attribute_diverged(results: Iterable, requests: dict, goldens, store=None) -> None:
    """Attribute every diverged result not attributed yet; requests: (template id, case id) -> RenderRequest,
    goldens: (template id, case id) -> Golden."""
    from conformance.judge.status import Status

    attribute_results([(r, requests[r.key], goldens(*r.key)) for r in results
                       if r.status == Status.DIVERGED and "attribution" not in r.extra], store=store)


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
    """attribute_template over every task in `processes` subprocesses; answers in task order."""
    shares: list = [[] for _ in range(processes)]
    loads = [0] * processes
    for index in sorted(range(len(tasks)), key=lambda i: -len(tasks[i][1])):  # biggest first, to the lightest
        lightest = loads.index(min(loads))
        shares[lightest].append(index)
        loads[lightest] += len(tasks[index][1])
    answers: list = [None] * len(tasks)

    def run(indices: list) -> None:
        from runners.harness import python_harness

        argv, env = python_harness("conformance.judge.attribution")
        try:
            done = subprocess.run(argv, input=pickle.dumps([tasks[i] for i in indices]), capture_output=True,
                                  env=env, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"exit code {done.returncode}: {done.stderr.decode('utf-8', 'replace')[-2000:]}")
            for index, answer in zip(indices, pickle.loads(done.stdout)):
                answers[index] = answer
        except Exception as exc:  # the worker failed: the same work in this process, so nothing is lost
            warnings.warn(f"attribution worker failed, attributing its share in-process: {exc}", RuntimeWarning,
                          stacklevel=1)
            for index in indices:
                answers[index] = attribute_template(tasks[index])

    threads = [threading.Thread(target=run, args=(share,), daemon=True) for share in shares if share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


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
    tasks = pickle.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(pickle.dumps([attribute_template(task) for task in tasks]))


if __name__ == "__main__":
    main()
