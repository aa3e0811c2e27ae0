"""Benchmark `chatgold explain`: cold (empty cache) and cached re-run, per engine.

Default plan (targets on 2 cores, TARGETS): each engine (llama.cpp, MiniJinja, @huggingface/jinja) over
llama.cpp's 75 bundled templates x every case (llama.cpp 10 min, the others 60 s), MiniJinja over the full corpus
(10 min; `llamacpp:full`, an hour, is not in the default plan); each cached re-run under 10 s. The render
and judging of the matrix is timed apart (it is `chatgold check`'s cost, not explain's).

    python benchmarks/bench_explain.py [--plan llamacpp:llamacpp,minijinja:full] [--templates N] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# llama.cpp's 75 bundled templates cold in 10 minutes and the full corpus in an hour, MiniJinja's full corpus in
# 10 minutes (every cold figure on 2 cores); MiniJinja and @huggingface/jinja on the 75 in a minute
TARGETS = {("llamacpp", "llamacpp"): 600.0, ("llamacpp", "full"): 3600.0, ("minijinja", "llamacpp"): 60.0,
           ("hfjs", "llamacpp"): 60.0, ("minijinja", "full"): 600.0}
CACHED_TARGET = 10.0
DEFAULT_PLAN = "llamacpp:llamacpp,minijinja:llamacpp,hfjs:llamacpp,minijinja:full"


def templates_of(corpus, which: str, limit):
    from benchmarks.bench_matrix import llamacpp_set

    chosen = llamacpp_set(corpus) if which == "llamacpp" else list(corpus.entries)
    return chosen[:limit] if limit else chosen


def measure(spec: str, which: str, limit, workers: int, budget, reduce_on_engine: bool = False) -> dict:
    from conformance.explain import explain
    from conformance.explain.cache import ExplainCache
    from conformance.judge.goldens import GoldenStore
    from conformance.checkrun import check_cells
    from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
    from runners import REFERENCE_RUNNER, get_runner, is_builtin

    selection = Selection.load()
    templates = templates_of(selection.corpus, which, limit)
    selection.templates = templates
    cells = selection.cells()
    families = {t.id: t.family for t in templates}
    requests = requests_by_cell(cells)
    options = {"budget": budget} if budget else {}
    with tempfile.TemporaryDirectory(prefix="chatgold-bench-explain-") as scratch:
        cache = ExplainCache(Path(scratch))
        engine = get_runner(spec, workers=workers, timeout=10)
        if reduce_on_engine and hasattr(engine, "reduce_in_process"):
            engine.reduce_in_process = False  # llama.cpp: a server start per candidate template
        reference = get_runner(REFERENCE_RUNNER, workers=workers, timeout=10)
        try:
            started = time.perf_counter()
            results = check_cells(engine, cells, GoldenJudge(GoldenStore()))
            matrix_seconds = time.perf_counter() - started
            starts_before = getattr(engine, "server_starts", None)
            started = time.perf_counter()
            cold = explain(results, engine, reference, requests, cache=cache, families=families,
                           engine_builtin=is_builtin(spec), **options)
            cold_seconds = time.perf_counter() - started
            starts_cold = getattr(engine, "server_starts", None)
            started = time.perf_counter()
            warm = explain(results, engine, reference, requests, cache=cache, families=families,
                           engine_builtin=is_builtin(spec), **options)
            warm_seconds = time.perf_counter() - started
            starts_warm = getattr(engine, "server_starts", None)
        finally:
            engine.close()
            reference.close()
    stats = cold.stats
    target = TARGETS.get((spec, which))
    out = {
        "runner": spec, "set": which, "templates": len(templates), "cases": len(selection.cases),
        "cells": len(cells), "non_matching": stats["cells"], "groups": stats["groups"], "causes": stats["causes"],
        "confirmed": stats["confirmed"], "unexplained": stats["unexplained"],
        "median_lines": stats["median_lines"], "median_messages": stats["median_messages"],
        "max_lines": stats["max_lines"], "renders_per_side": stats["renders"],
        "renders_by_pass": stats.get("renders_by_pass"), "budget_spent": stats.get("budget_spent"),
        "matrix_seconds": round(matrix_seconds, 2), "cold_seconds": round(cold_seconds, 2),
        "cached_seconds": round(warm_seconds, 2), "cached_reduced": warm.stats["reduced"],
        "reference_seconds": stats["reference_seconds"], "engine_seconds": stats["engine_seconds"],
        "reducer": stats.get("reducer"),
        "candidates_per_second": round(stats["renders"] / cold_seconds, 1) if cold_seconds else None,
        "confirm_seconds": stats.get("confirm_seconds"),
        "target_seconds": target, "meets_target": None if target is None else cold_seconds <= target,
        "cached_target_seconds": CACHED_TARGET, "cached_meets_target": warm_seconds <= CACHED_TARGET,
        "top_causes": [{"id": c.id, "title": c.title, "cells": len(c.cells), "gain": c.gain}
                       for c in cold.causes[:10]],
    }
    if starts_before is not None:
        out["server_starts_cold"] = starts_cold - starts_before
        out["server_starts_cached"] = starts_warm - starts_cold
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default=DEFAULT_PLAN, help="runner:set pairs (set: llamacpp or full)")
    parser.add_argument("--templates", type=int, default=None, help="first N templates of each set")
    parser.add_argument("--cases", type=int, default=None, help="(accepted for run_all; explain uses every case)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=int, default=None, help="candidate renders per reduction")
    parser.add_argument("--reduce-on-engine", action="store_true",
                        help="render candidates on the engine itself (llama.cpp: no in-process reducer)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    rows = []
    for item in args.plan.split(","):
        spec, _, which = item.partition(":")
        try:
            rows.append(measure(spec, which or "llamacpp", args.templates, args.workers, args.budget,
                                args.reduce_on_engine))
        except Exception as exc:  # one engine missing must not lose the others' numbers
            rows.append({"runner": spec, "set": which, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), file=sys.stderr)
    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "runs": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    else:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
