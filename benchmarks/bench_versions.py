"""Benchmark the cost of adding an engine version: install (or build) time on first use, then a cached re-run.

For each spec, in a scratch cache (CHATGOLD_CACHE pointed at a temporary directory, so nothing cached is
reused; pip's and npm's own download caches still are): the first `get_runner(spec)` + render of a sample
(install + run), then the same again (cached: open + run), and the render alone. llama.cpp builds take minutes
and are measured only with --builds (they are reported from the build's own BUILD-INFO.json otherwise).

    python benchmarks/bench_versions.py [--specs minijinja@2.10.2,hfjs@0.5.5,hf@4.57.6] [--templates 10]
                                        [--cases 20] [--builds] [--out bench.json]
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

DEFAULT_SPECS = "minijinja@2.10.2,hfjs@0.5.5,hf@4.57.6"


def _requests(templates: int, cases: int) -> list:
    from conformance.judge.pipeline import Selection

    selection = Selection.load()
    selection.templates = selection.templates[:templates]
    selection.cases = selection.cases[:cases]
    return [cell.request for cell in selection.cells()]


def _timed_run(spec: str, requests: list) -> dict:
    from runners import get_runner

    started = time.perf_counter()
    runner = get_runner(spec)
    opened = time.perf_counter()
    try:
        outcomes = list(runner.render_many(requests))
    finally:
        runner.close()
    done = time.perf_counter()
    return {"open_seconds": round(opened - started, 2), "render_seconds": round(done - opened, 2),
            "total_seconds": round(done - started, 2), "rendered": sum(o.kind == "rendered" for o in outcomes)}


def bench_spec(spec: str, requests: list) -> dict:
    first = _timed_run(spec, requests)    # installs into the scratch cache
    cached = _timed_run(spec, requests)   # everything cached
    return {"spec": spec, "cells": len(requests), "first_use": first, "cached": cached,
            "install_seconds": round(first["open_seconds"] - cached["open_seconds"], 2)}


def llamacpp_builds() -> list:
    """Build times recorded by the source builds already in the real cache: llama-server (BUILD-INFO.json) and
    llama-cpp-python (its install record)."""
    from runners.llamacpp import build
    from runners.versions import cache_root

    out = []
    for path in sorted(build.cache_root().glob("llama.cpp-b*/BUILD-INFO.json")):
        info = json.loads(path.read_text())
        out.append({"tag": info.get("tag"), "build_seconds": info.get("seconds")})
    for path in sorted((cache_root() / "venvs").glob("llama-cpp-python-*/chatgold-install.json")):
        info = json.loads(path.read_text())
        out.append({"tag": path.parent.name, "build_seconds": info.get("seconds")})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default=DEFAULT_SPECS, help="comma-separated NAME@VERSION specs")
    parser.add_argument("--templates", type=int, default=10)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--builds", action="store_true", help="also build llamacpp@<spec> versions given in --specs")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    requests = _requests(args.templates, args.cases)
    real_cache = os.environ.get("CHATGOLD_CACHE")
    results = []
    with tempfile.TemporaryDirectory(prefix="chatgold-bench-versions-") as scratch:
        for spec in [s.strip() for s in args.specs.split(",") if s.strip()]:
            if spec.startswith("llamacpp@") and not args.builds:
                continue
            os.environ["CHATGOLD_CACHE"] = scratch
            try:
                results.append(bench_spec(spec, requests))
            except Exception as exc:  # one version that cannot be had must not hide the others
                results.append({"spec": spec, "error": f"{type(exc).__name__}: {exc}"[:500]})
            finally:
                if real_cache is None:
                    os.environ.pop("CHATGOLD_CACHE", None)
                else:
                    os.environ["CHATGOLD_CACHE"] = real_cache
    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "templates": args.templates, "cases": args.cases, "versions": results,
              "llamacpp_builds": llamacpp_builds()}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
