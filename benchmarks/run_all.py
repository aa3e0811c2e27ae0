"""Run every benchmark, write benchmarks/results.json and a Markdown table for README.md.

    python -m benchmarks [--templates N] [--cases N] [--runners hf,minijinja,...] [--set llamacpp|full]
                         [--gate SET:SCENARIOS ...] [--readme README.md]

--gate full:cold,warm,one-change --gate llamacpp:warm runs benchmarks/bench_gate.py once per --gate (default:
the llama.cpp set cold, warm and with one template changed).

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
OPTIONAL = ["bench_evaluator.py", "bench_llamacpp.py", "bench_service.py", "bench_service_soak.py",
            "bench_properties.py"]


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


def _gate_runs(results: dict) -> list:
    """Every bench_gate run recorded: (its entry name, the run)."""
    found = []
    for name, entry in results["benchmarks"].items():
        if name.startswith("bench_gate.py") and entry.get("result"):
            gate = entry["result"]
            for run in gate["runs"]:
                found.append((gate, run))
    return found


def table(results: dict) -> str:
    lines = [f"Measured {results['date']} on {results['machine']} ({results['cpus']} cores).", ""]
    matrix = results["benchmarks"].get("bench_matrix.py", {}).get("result")
    if matrix:
        load = matrix.get("load_average")
        lines += [f"Native vs suite: {matrix['templates']} templates ({matrix['set']} set) x {matrix['cases']} cases"
                  + (f", load average {load[0]}-{load[1]} on {matrix.get('cpus')} cores" if load else "") + ".", "",
                  "| runner | cells | native ms/cell | suite ms/cell | suite / native | native CPU ms | suite CPU ms "
                  "| CPU ratio | raw v1 ms/cell | raw v2 ms/cell | conformance |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in matrix["runners"]:
            if "error" in row:
                lines.append(f"| {row['runner']} | error: {row['error'][:60]} | | | | | | | | | |")
            elif "native_ms_per_cell" in row:
                lines.append(f"| {row['runner']} | {row['cells']} | {row['native_ms_per_cell']} | "
                             f"{row['suite_ms_per_cell']} | {row['suite_over_native']}x | "
                             f"{row['native_cpu_ms_per_cell']} | {row['suite_cpu_ms_per_cell']} | "
                             f"{row['suite_over_native_cpu']}x | {row['v1_raw_ms_per_cell'] or '-'} | "
                             f"{row['raw_ms_per_cell']} | {row['conformance']}% |")
        lines += ["", "native: the engine's own in-process render of the same cells (compiled templates reused). suite: "
                      "the check path (harness processes, goldens read, every cell judged; no result store), "
                      f"{matrix['runners'][0].get('workers', 2)} engine processes. CPU: this process and the harness "
                      "processes. raw v1/v2: render_many alone, the harness spoken to in protocol version 1 (one "
                      "render message per cell) or 2 (batches)."]
        attributed = [row for row in matrix["runners"] if row.get("attributed_cells")]
        if attributed:
            lines += ["", "Attribution (a traced evaluator render per diverged cell, for the report): " + ", ".join(
                f"{row['runner']} {row['attribution_seconds']} s for {row['attributed_cells']} cells"
                for row in attributed) + "."]
        lines += ["", f"All runners, total wall time: {matrix['total_seconds']} s."]
    gate_runs = _gate_runs(results)
    if gate_runs:
        lines += ["", "The gate itself (`pytest --pyargs conformance.gate`: the reference, the capability goldens and "
                      f"{len(gate_runs[0][0]['runners'])} engines), on one result store:", "",
                  "| selection | store | wall s | CPU-s | cells reused | cells rendered | load average | where the CPU went |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for gate, run in gate_runs:
            cpu = ", ".join(f"{kind} {seconds}" for kind, seconds in list(run["cpu_seconds"].items())[:4])
            scenario = run.get("scenario", "cold")
            label = {"cold": "cold", "warm": "warm, nothing changed", "one-change": "warm, one template changed",
                     "verify": "warm, reference re-verified"}.get(scenario, scenario)
            load = run.get("load_average")
            lines.append(f"| {gate['set']} ({gate['templates']} x {gate['cases']}) | {label} | {run['wall_seconds']} | "
                         f"{run['cpu_total']} | {run.get('cells_reused', '-')} | {run.get('cells_rendered', '-')} | "
                         f"{'-'.join(str(x) for x in load) if load else '-'} | {cpu} |")
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
    explain = results["benchmarks"].get("bench_explain.py", {}).get("result")
    if explain:
        lines += ["", "| explain | cells | non-matching | causes | median repro | cold s (target) | cached s | renders/side |",
                  "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
        for row in explain["runs"]:
            if "error" in row:
                lines.append(f"| {row['runner']} ({row['set']}) | error: {row['error'][:60]} | | | | | | |")
                continue
            lines.append(f"| {row['runner']} ({row['templates']} templates) | {row['cells']} | {row['non_matching']} | "
                         f"{row['causes']} ({row['confirmed']} confirmed) | {row['median_lines']} line(s), "
                         f"{row['median_messages']} message(s) | {row['cold_seconds']} ({row['target_seconds']}) | "
                         f"{row['cached_seconds']} | {row['renders_per_side']} |")
    versions = results["benchmarks"].get("bench_versions.py", {}).get("result")
    if versions:
        parts = [f"{v['spec']} {v['install_seconds']} s to install, {v['cached']['total_seconds']} s cached re-run"
                 for v in versions["versions"] if "error" not in v]
        builds = [f"llama.cpp {b['tag']} {b['build_seconds']} s" for b in versions["llamacpp_builds"]]
        lines += ["", f"Adding an engine version ({versions['templates']} templates x {versions['cases']} cases): "
                      + "; ".join(parts) + (". Builds: " + ", ".join(builds) if builds else "") + "."]
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
    parser.add_argument("--gate", action="append", metavar="SET:SCENARIOS",
                        help="a gate benchmark, e.g. full:cold,warm,one-change (repeatable; default "
                             "llamacpp:cold,warm,one-change)")
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
        "bench_explain.py": [],
        "bench_versions.py": [],
    }
    for gate in args.gate or ["llamacpp:cold,warm,one-change"]:
        gate_set, _, scenarios = gate.partition(":")
        plan[f"bench_gate.py {gate_set}"] = ["--set", gate_set, "--scenarios", scenarios or "cold,warm"]
    for name in OPTIONAL:
        if (HERE / name).exists():
            plan[name] = list(limits)
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.system()} {platform.machine()}",
               "cpus": os.cpu_count(), "python": platform.python_version(), "benchmarks": {}}
    if args.only:
        plan = {k: v for k, v in plan.items() if k.split()[0] in args.only}
    for name, extra in plan.items():
        script = name.split()[0]
        print(f"benchmarks: {script} {' '.join(extra)}", file=sys.stderr)
        entry = _run(script, extra, args.timeout)
        if "error" in entry and "unrecognized arguments" in entry["error"] and extra:
            entry = _run(script, [], args.timeout)   # a benchmark without our limit options
        results["benchmarks"][name] = entry
    Path(args.out).write_text(json.dumps(results, indent=1))
    block = table(results)
    print(block)
    if args.readme:
        splice(Path(args.readme), block)
    return 1 if any("error" in e for e in results["benchmarks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
