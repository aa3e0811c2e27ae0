"""Benchmark the llama.cpp runner: matrix wall time, renders/s, server start cost.

Templates: the repo corpus (templates/manifest.json) when it exists, else the .jinja files that llama.cpp ships
in models/templates, read straight from the verified source archive in the cache. Cases: conformance/cases.
Target (issue 4): 75 templates x 30 cases in <= 10 s on the 2-core machine.

    python benchmarks/bench_llamacpp.py [--templates 75] [--cases 30] [--workers 2] [--out bench.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runners.llamacpp import LlamaCppRunner, build, build_llama_server  # noqa: E402


def corpus_templates(limit: int) -> tuple:
    manifest = ROOT / "templates" / "manifest.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text(encoding="utf-8"))
        entries = data["templates"][:limit]
        return "templates/manifest.json", [
            (e["id"], (manifest.parent / e["file"]).read_text(encoding="utf-8"), e.get("bos_token"), e.get("eos_token"))
            for e in entries]
    tarball = build.fetch_source(build.cache_root() / "bench-fetch.log")
    found = []
    with tarfile.open(tarball) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if "/llama.cpp/models/templates/" in member.name and member.name.endswith(".jinja") and member.isfile():
                text = archive.extractfile(member).read().decode("utf-8")
                found.append((Path(member.name).stem, text, None, None))
    return f"{tarball.name}:models/templates", found[:limit]


def load_case_list(limit: int) -> list:
    from conformance.corpus.cases import load_cases

    return load_cases()[:limit]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=75)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    build_llama_server()
    source, templates = corpus_templates(args.templates)
    cases = load_case_list(args.cases)
    requests = [case.request(text, bos, eos, template_id=tid) for tid, text, bos, eos in templates for case in cases]

    with LlamaCppRunner(timeout=args.timeout, workers=args.workers) as runner:
        probe_started = time.perf_counter()
        clock_problem = runner.clock_status()  # the clock probe: one server start, outside the matrix timing
        probe_seconds = time.perf_counter() - probe_started
        starts_before, start_seconds_before = runner.server_starts, runner.start_seconds
        started = time.perf_counter()
        outcomes = list(runner.render_many(requests))
        wall = time.perf_counter() - started
        starts = runner.server_starts - starts_before
        start_seconds = runner.start_seconds - start_seconds_before
        restarts = runner.restarts

    kinds = collections.Counter(o.kind for o in outcomes)
    timeouts = sum(1 for o in outcomes if getattr(o, "timed_out", False))
    result = {
        "engine": f"llama.cpp {build.LLAMA_CPP_TAG}",
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "template_source": source,
        "templates": len(templates), "cases": len(cases), "cells": len(requests), "workers": args.workers,
        "wall_seconds": round(wall, 3),
        "renders_per_second": round(len(requests) / wall, 1) if wall else None,
        "server_starts": starts,
        "mean_server_start_ms": round(1000 * start_seconds / starts, 1) if starts else None,
        "clock_probe_ms": round(1000 * probe_seconds, 1),
        "clock_frozen": clock_problem is None,
        "restarts": restarts,
        "outcomes": dict(kinds), "timeouts": timeouts,
        "target": "75 templates x 30 cases <= 10 s",
        "meets_target": len(templates) >= 75 and len(cases) >= 30 and wall <= 10.0,
    }
    rows = [("cells", f"{result['cells']} ({result['templates']} templates x {result['cases']} cases)"),
            ("wall time", f"{wall:.2f} s"), ("renders/s", str(result["renders_per_second"])),
            ("server starts", f"{starts} (mean {result['mean_server_start_ms']} ms)"),
            ("clock probe", f"{result['clock_probe_ms']} ms, frozen={result['clock_frozen']}"),
            ("restarts", str(restarts)), ("outcomes", json.dumps(dict(kinds))), ("timeouts", str(timeouts)),
            ("target met", str(result["meets_target"]))]
    width = max(len(k) for k, _ in rows)
    print(f"llama.cpp runner benchmark ({source}, workers={args.workers})")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
