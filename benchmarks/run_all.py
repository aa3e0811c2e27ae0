"""Run every benchmark, write benchmarks/results.json and a Markdown table for README.md.

    python -m benchmarks [--templates N] [--cases N] [--runners hf,minijinja,...] [--set llamacpp|full]
                         [--readme README.md]

Our benchmarks run in this process's interpreter as subprocesses (each with --out); the other engineers'
bench_evaluator.py, bench_llamacpp.py, bench_service.py run too when present. A failing benchmark is recorded
as an error, the rest still run. --readme splices the table between <!-- bench:start --> and <!-- bench:end -->.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
OPTIONAL = ["bench_evaluator.py", "bench_llamacpp.py", "bench_service.py", "bench_properties.py"]


def _run(script: str, extra: list, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(HERE / script), *extra, "--out", str(out)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        seconds = round(time.perf_counter() - started, 2)
        if done.returncode == 2 and "unrecognized arguments" in done.stderr and "--out" in done.stderr:
            # A benchmark that prints its JSON (--json) instead of writing --out.
            bare = [a for a in extra if a not in ("--templates", "--cases") and not a.isdigit()]
            done = subprocess.run([sys.executable, str(HERE / script), *bare, "--json"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=timeout)
            if done.returncode == 0:
                try:
                    result, _ = json.JSONDecoder().raw_decode(done.stdout.strip())
                    return {"seconds": round(time.perf_counter() - started, 2), "result": result}
                except ValueError:
                    pass
        if done.returncode != 0 or not out.exists():
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}", "seconds": seconds}
        return {"seconds": seconds, "result": json.loads(out.read_text())}


def table(results: dict) -> str:
    lines = [f"Measured {results['date']} on {results['machine']} ({results['cpus']} cores).", ""]
    matrix = results["benchmarks"].get("bench_matrix.py", {}).get("result")
    if matrix:
        lines += [f"Matrix: {matrix['templates']} templates ({matrix['set']} set) x {matrix['cases']} cases.", "",
                  "| runner | cells | suite s | raw engine s | overhead | ms/cell | conformance | attribution |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in matrix["runners"]:
            if "error" in row:
                lines.append(f"| {row['runner']} | error: {row['error'][:60]} | | | | | | |")
            else:
                lines.append(f"| {row['runner']} | {row['cells']} | {row['suite_seconds']} | {row['raw_seconds']} | "
                             f"{row['overhead_ratio']}x | {row['ms_per_cell']} | {row['conformance']}% | "
                             f"{row.get('attribution_seconds', '-')} s for {row.get('attributed_cells', '-')} cells |")
        lines += ["", "Overhead: the suite's check path (render, read goldens, classify) over the raw engine time of "
                      "the same cells. Attribution (a traced evaluator render per diverged cell, for the report) "
                      "is timed apart."]
        lines += ["", f"All runners, total wall time: {matrix['total_seconds']} s."]
    gate = results["benchmarks"].get("bench_gate.py", {}).get("result")
    if gate:
        run = gate["runs"][0]
        cpu = ", ".join(f"{kind} {seconds} s" for kind, seconds in list(run["cpu_seconds"].items())[:6])
        lines += ["", f"The gate itself (`pytest --pyargs conformance.gate`, {len(gate['runners'])} engines + the "
                      f"reference + capability goldens) on the {gate['set']} set ({gate['templates']} templates x "
                      f"{gate['cases']} cases): {run['wall_seconds']} s wall (target {gate['target_seconds']:.0f} s), "
                      f"{run['cpu_total']} CPU-s: {cpu}."]
    gguf = results["benchmarks"].get("bench_gguf.py", {}).get("result")
    if gguf:
        lines += ["", f"GGUF header: read_header {gguf['read_header_ms']} ms vs gguf.GGUFReader "
                      f"{gguf['gguf_reader_ms']} ms on {gguf['files']} files ({gguf['speedup']}x)."]
    cold = results["benchmarks"].get("bench_cold_start.py", {}).get("result")
    if cold:
        lines += ["", "Cold start of `chatgold render`: " + ", ".join(
            f"{r['runner']} {r['seconds_min']} s" for r in cold["runners"])]
    llama = results["benchmarks"].get("bench_llamacpp.py", {}).get("result")
    if llama:
        lines += ["", f"llama.cpp runner, {llama['templates']} templates x {llama['cases']} cases "
                      f"({llama['workers']} servers at a time): {llama['wall_seconds']} s wall (target 10 s), "
                      f"{llama['renders_per_second']} renders/s, server start {llama['mean_server_start_ms']} ms."]
    if any(results["benchmarks"].get(name) for name in OPTIONAL):
        lines.append("")
    for name in OPTIONAL:
        entry = results["benchmarks"].get(name)
        if entry:
            lines.append(f"{name}: " + ("error" if "error" in entry else f"ran in {entry['seconds']} s") +
                         " (see benchmarks/results.json)  ")
    return "\n".join(lines) + "\n"


def splice(readme: Path, block: str) -> None:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} markers to put the table between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{block}{END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=None, help="first N templates of the set")
    parser.add_argument("--cases", type=int, default=None, help="first N cases")
    parser.add_argument("--runners", default="hf,minijinja,hfjs,evaluator")
    parser.add_argument("--set", choices=("llamacpp", "full"), default="llamacpp")
    parser.add_argument("--gguf-files", type=int, default=4, help="GGUF files to read (GGUFReader: seconds each)")
    parser.add_argument("--only", action="append", help="run only these benchmark scripts")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--readme", default=None, help="README to splice the table into")
    args = parser.parse_args(argv)
    limits = (["--templates", str(args.templates)] if args.templates else []) + \
             (["--cases", str(args.cases)] if args.cases else [])
    plan = {
        "bench_matrix.py": [*limits, "--runners", args.runners, "--set", args.set],
        "bench_gguf.py": ["--files", str(args.gguf_files)],
        "bench_cold_start.py": ["--runners", args.runners],
        "bench_gate.py": ["--set", "llamacpp"],
    }
    for name in OPTIONAL:
        if (HERE / name).exists():
            plan[name] = list(limits)
    if args.only:
        plan = {k: v for k, v in plan.items() if k in args.only}
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.system()} {platform.machine()}",
               "cpus": os.cpu_count(), "python": platform.python_version(), "benchmarks": {}}
    for script, extra in plan.items():
        print(f"benchmarks: {script} {' '.join(extra)}", file=sys.stderr)
        entry = _run(script, extra, args.timeout)
        if "error" in entry and "unrecognized arguments" in entry["error"] and extra:
            entry = _run(script, [], args.timeout)   # a benchmark without our limit options
        results["benchmarks"][script] = entry
    Path(args.out).write_text(json.dumps(results, indent=1))
    block = table(results)
    print(block)
    if args.readme:
        splice(Path(args.readme), block)
    return 1 if any("error" in e for e in results["benchmarks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
