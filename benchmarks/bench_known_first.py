"""Candidates per group with and without the baseline's known mechanisms tested first (causes.look_up).

Explains the same non-matching cells twice, each with an empty root-cause cache: once as a fresh explain
(every group reduced) and once given the runner's baseline causes (a group first renders the known causes'
reproducer templates with its own data; one that differs exactly as the group does is its mechanism, and only
the case is reduced). Cell outcomes come from the result store (rendered when missing).

    python benchmarks/bench_known_first.py --runner llamacpp --templates 8 [--seed 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sample_templates(selection, baseline, count: int, seed: int) -> list:
    """Templates with cells the baseline lists without a cause (what a re-record must still explain)."""
    bare = sorted(t for t, cases in baseline.cells.items()
                  if any("@" not in value for value in cases.values()))
    chosen = set(random.Random(seed).sample(bare, min(count, len(bare))))
    return [t for t in selection.templates if t.id in chosen]


def run(spec: str, count: int, seed: int, budget) -> dict:
    from conformance.checkrun import check_cells
    from conformance.explain import explain
    from conformance.explain.cache import ExplainCache
    from conformance.judge.expectations import load_expectations
    from conformance.judge.goldens import GoldenStore
    from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
    from conformance.render.store import ResultStore
    from runners import REFERENCE_RUNNER, get_runner, is_builtin

    baseline = load_expectations(spec)
    selection = Selection.load()
    selection.templates = sample_templates(selection, baseline, count, seed)
    cells = selection.cells()
    requests = requests_by_cell(cells)
    families = {t.id: t.family for t in selection.templates}
    options = {"budget": budget} if budget else {}
    engine = get_runner(spec, workers=2, timeout=10)
    reference = get_runner(REFERENCE_RUNNER, workers=2, timeout=10)
    rows = {}
    try:
        results = check_cells(engine, cells, GoldenJudge(GoldenStore()), store=ResultStore(), tokens=False)
        for name, known in (("reduce every group", ()), ("known mechanisms first", list(baseline.causes.values()))):
            with tempfile.TemporaryDirectory(prefix="chatgold-bench-known-") as scratch:
                started = time.perf_counter()
                explanation = explain(results, engine, reference, requests, cache=ExplainCache(Path(scratch)),
                                      families=families, engine_builtin=is_builtin(spec), known_causes=known,
                                      **options)
                seconds = time.perf_counter() - started
            stats = explanation.stats
            explained = sum(len(c.cells) for c in explanation.causes)
            rows[name] = {"seconds": round(seconds, 1), "groups": stats["groups"], "reduced": stats["reduced"],
                          "reduction_renders": stats["reduction_renders"],
                          "renders_per_group": stats["renders_per_group"], "known_first": stats["known_first"],
                          "causes": stats["causes"], "cells": stats["cells"], "explained": explained,
                          "baseline_causes": sum(1 for c in explanation.causes if c.id in baseline.causes),
                          "renders_by_pass": stats["renders_by_pass"]}
            print(name, json.dumps(rows[name]), file=sys.stderr)
    finally:
        engine.close()
        reference.close()
    return {"runner": spec, "templates": [t.id for t in selection.templates], "cells": len(cells), "runs": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", default="llamacpp")
    parser.add_argument("--templates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget", type=int, default=None)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = run(args.runner, args.templates, args.seed, args.budget)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
