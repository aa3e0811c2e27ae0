"""`chatgold compat` on a GGUF: one corpus template written into a GGUF file, rendered by the reference and every
default engine on every case, cold (`--no-cache`: every cell rendered) and warm (the result store reused).
The issue's target: at most 2 minutes on 2 cores for the cold run. Wall time and CPU of the whole command
(engine processes included), measured, never asserted.

    python benchmarks/bench_compat.py [--template qwen-qwen2.5-7b-instruct] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(template_id: str) -> dict:
    from conformance.analysis.compat import DEFAULT_ENGINES
    from conformance.corpus.manifest import load_corpus
    from runners.llamacpp.model import write_model

    entry = load_corpus().get(template_id)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "model.gguf"
        write_model(gguf, entry.source(), entry.bos_token, entry.eos_token)
        for scenario, extra in (("cold", ["--no-cache"]), ("warm", [])):
            out = Path(tmp) / f"{scenario}.json"
            cpu, started = _cpu(), time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "conformance.cli", "compat", str(gguf), "--format", "json",
                                   "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
            wall, cpu = time.perf_counter() - started, _cpu() - cpu
            if done.returncode not in (0, 1) or not out.exists():
                rows[scenario] = {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
                continue
            record = json.loads(out.read_text())["templates"][0]
            rows[scenario] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                              "cells": record["reference"]["cases"] * (1 + len(record["engines"])),
                              "engines": {e["engine"]: {k: e["counts"][k] for k in e["counts"]} | {
                                  "explained": e["explained"], "unexplained": e["unexplained"]}
                                  for e in record["engines"]}}
    return {"template": template_id, "engines": list(DEFAULT_ENGINES), "scenarios": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", default="qwen-qwen2.5-7b-instruct", help="corpus template id")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    text = json.dumps(run(args.template), indent=1)
    Path(args.out).write_text(text) if args.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
