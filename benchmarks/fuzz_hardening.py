"""The full hardening fuzz run: tests/test_fuzz_hardening.py with --examples inputs per target (templates, cases,
request bodies, tokenizer_config shapes, raw request headers, result store states; default 3400 each), fixed
seed. `tox -e py` runs a slice of the same tests.

    python benchmarks/fuzz_hardening.py [--examples 3400] [--out results.json]

Prints the figures (inputs, outcomes, restarts, peak memory, seconds per target) and a README line; exit status
1 when a property failed (pytest's output says which input).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3400, help="inputs per target (six targets)")
    parser.add_argument("--out", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = dict(os.environ, CHATGOLD_FUZZ_EXAMPLES=str(args.examples), CHATGOLD_FUZZ_REPORT=str(report),
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               "tests/test_fuzz_hardening.py"], cwd=ROOT, env=env, capture_output=True, text=True)
        figures = json.loads(report.read_text()) if report.exists() else {}
    figures = {"targets": figures, "passed": done.returncode == 0, "seconds": round(time.monotonic() - started, 1),
               "inputs": sum(t.get("inputs", 0) for t in figures.values())}
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(figures, indent=1, sort_keys=True))
    else:
        for name, target in sorted(figures["targets"].items()):
            print(f"{name}: {json.dumps(target, sort_keys=True)}")
        print(readme_line(figures))
    if done.returncode != 0:
        print(done.stdout[-6000:], file=sys.stderr)
    return 0 if done.returncode == 0 else 1


def readme_line(figures: dict) -> str:
    targets = figures["targets"]
    parts = []
    for name in ("templates", "cases", "bodies"):
        target = targets.get(name, {})
        parts.append(f"{target.get('inputs', 0)} {name}")
    peak = max((t.get("harness_peak_mb", 0) for t in targets.values()), default=0)
    growth = targets.get("bodies", {}).get("server_growth_mb")
    verdict = "no traceback, no 5xx, no crashed harness" if figures["passed"] else "FAILED (see the output)"
    return (f"Fuzz (hypothesis, fixed seed): {figures['inputs']} inputs ({', '.join(parts)}) in "
            f"{figures['seconds']:.0f} s: {verdict}; evaluator harness peak {peak} MB, server growth {growth} MB.")


if __name__ == "__main__":
    sys.exit(main())
