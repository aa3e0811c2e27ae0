"""Benchmark llama.cpp in process (runners/llamacpp/inproc.py) against llama-server, per route (Jinja, built-in).

Two measurements on llama.cpp's bundled templates (75) x every case (95):
- the matrix: every cell on the server and in process, wall time, and the cells where they differ (0 expected);
- candidates: templates a reducer would render, each a distinct template (a bundled template with a comment
  appended, `--variants` per template) with one case: a server start each on llama-server, none in process.

    python benchmarks/bench_llamacpp_inproc.py [--routes jinja,builtin] [--variants 4] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bundled_requests() -> list:
    from benchmarks.bench_matrix import llamacpp_set
    from conformance.judge.pipeline import Selection

    selection = Selection.load()
    selection.templates = llamacpp_set(selection.corpus)
    return [cell.request for cell in selection.cells()]


def candidate_requests(requests: list, variants: int) -> list:
    """Distinct templates with one conversation each, as a reduction's template passes render them."""
    from runners.base import RenderRequest

    first = {}
    for request in requests:
        first.setdefault(request.template_id, request)
    out = []
    for request in first.values():
        for n in range(variants):
            out.append(RenderRequest(request.template + "{# candidate %d #}" % n, request.conversation,
                                     request.bos_token, request.eos_token, request.template_id, request.case_id))
    return out


def timed(runner, requests: list) -> tuple:
    started = time.perf_counter()
    outcomes = list(runner.render_many(requests))
    return outcomes, time.perf_counter() - started


def measure(route: str, variants: int, workers: int) -> dict:
    from runners.llamacpp import LlamaCppBuiltinRunner, LlamaCppRunner
    from runners.llamacpp.inproc import LlamaCppInprocRunner

    builtin = route == "builtin"
    requests = bundled_requests()
    candidates = candidate_requests(requests, variants)
    server_class = LlamaCppBuiltinRunner if builtin else LlamaCppRunner
    with server_class(workers=workers) as server, LlamaCppInprocRunner(builtin=builtin, workers=workers) as ours:
        server.binary()
        ours.render(requests[0])  # start the harness processes' first one outside the timing
        theirs, server_seconds = timed(server, requests)
        mine, inproc_seconds = timed(ours, requests)
        theirs_c, server_c_seconds = timed(server, candidates)
        mine_c, inproc_c_seconds = timed(ours, candidates)
        starts = server.server_starts
    differing = [(r.template_id, r.case_id) for r, a, b in zip(requests, theirs, mine) if a != b]
    differing_c = [(r.template_id, r.case_id) for r, a, b in zip(candidates, theirs_c, mine_c) if a != b]
    return {
        "route": route, "cells": len(requests), "templates": len({r.template_id for r in requests}),
        "matrix_server_seconds": round(server_seconds, 2), "matrix_inproc_seconds": round(inproc_seconds, 2),
        "cells_differing": len(differing), "differing_examples": differing[:10],
        "candidates": len(candidates), "candidates_server_seconds": round(server_c_seconds, 2),
        "candidates_inproc_seconds": round(inproc_c_seconds, 2),
        "candidates_per_second_server": round(len(candidates) / server_c_seconds, 1),
        "candidates_per_second_inproc": round(len(candidates) / inproc_c_seconds, 1),
        "candidates_differing": len(differing_c), "server_starts": starts,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default="jinja,builtin")
    parser.add_argument("--variants", type=int, default=4, help="candidate templates per bundled template")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for route in args.routes.split(","):
        rows.append(measure(route, args.variants, args.workers))
        print(json.dumps(rows[-1]), file=sys.stderr)
    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "runs": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
