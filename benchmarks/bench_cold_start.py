"""Cold start of `chatgold render` per runner: one subprocess, one cell, wall time."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(runners: list, template: str, case: str, repeat: int) -> dict:
    rows = []
    for spec in runners:
        times, code = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "conformance.cli", "render", "--runner", spec,
                                   "--template", template, "--case", case], cwd=ROOT, capture_output=True, timeout=600)
            times.append(time.perf_counter() - t0)
            code = done.returncode
        rows.append({"runner": spec, "seconds_min": round(min(times), 3), "seconds_max": round(max(times), 3),
                     "exit_code": code})
    return {"template": template, "case": case, "runners": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runners", default="hf,minijinja,hfjs,evaluator")
    parser.add_argument("--template", default="ollama-chatml-9")
    parser.add_argument("--case", default="chat-multi-turn")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    text = json.dumps(run(args.runners.split(","), args.template, args.case, args.repeat), indent=1)
    Path(args.out).write_text(text) if args.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
