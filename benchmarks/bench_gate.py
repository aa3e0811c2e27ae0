"""The conformance gate's wall time, measured by running it: `pytest --pyargs conformance.gate` with every runner.

    python benchmarks/bench_gate.py [--set llamacpp|full] [--shards N] [--out gate.json]

--set llamacpp: the templates llama.cpp ships (its models/templates and vocab GGUFs) x all cases x all
runners (issue target: 30 s on 2 cores). --set full: the whole corpus (target: 10 minutes). --shards N runs
the N shards (`--chatgold-shard I/N`) one after another and reports each: on an N-machine CI matrix the gate
takes the slowest shard's time. The per-process CPU of the run comes from /proc (the gate and every engine it
starts), so the report says where the time went.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RUNNERS = ["evaluator", "llamacpp", "minijinja", "hfjs", "ferrox", "chatml-builtin", "paperkiln"]
TICKS = os.sysconf("SC_CLK_TCK")


def _process_kind(pid: int) -> str:
    try:
        argv = [a.decode("utf-8", "replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return "?"
    text = " ".join(argv)
    if "llama-server" in text:
        return "llama-server"
    if "pytest" in text:
        return "gate (pytest)"
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        return argv[argv.index("-m") + 1]
    if argv and "node" in Path(argv[0]).name:
        return "node (hfjs)"
    for name in ("ferrox", "chatml", "paperkiln"):
        if name in text:
            return f"example harness {name}"
    return Path(argv[0]).name if argv else "?"


def _descendants(root: int) -> list:
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[parent].append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


class CpuSampler:
    """CPU seconds per kind of process under a root pid, sampled twice a second (a process that lives less
    than a sample is missed; llama-server per template lives longer)."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in _descendants(self.root):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    seconds = (int(fields[11]) + int(fields[12])) / TICKS
                except (OSError, IndexError, ValueError):
                    continue
                kind = self.seen.get(pid, (None, 0.0))[0] or _process_kind(pid)
                self.seen[pid] = (kind, seconds)
            self._stop.wait(0.5)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        totals = collections.Counter()
        for kind, seconds in self.seen.values():
            totals[kind] += seconds
        return {kind: round(seconds, 1) for kind, seconds in totals.most_common()}


def run_gate(selection: list, report_dir: Path) -> dict:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "conformance.gate",
            "--chatgold-report", str(report_dir)]
    for runner in RUNNERS:
        argv += ["--chatgold-runner", runner]
    argv += selection
    env = dict(os.environ, CHATGOLD_ROOT=str(ROOT))
    started = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = CpuSampler(proc.pid)
        code = proc.wait()
        cpu = sampler.stop()
        log.seek(0)
        tail = log.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    wall = time.perf_counter() - started
    return {"wall_seconds": round(wall, 1), "exit_code": code, "pytest": tail[0] if tail else "",
            "cpu_seconds": cpu, "cpu_total": round(sum(cpu.values()), 1)}


def llamacpp_selection() -> tuple:
    from bench_matrix import llamacpp_set

    from conformance.corpus.manifest import load_corpus

    templates = llamacpp_set(load_corpus())
    selection = []
    for entry in templates:
        selection += ["--chatgold-template", entry.id]
    return len(templates), selection


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("llamacpp", "full"), default="llamacpp")
    parser.add_argument("--shards", type=int, default=1, help="run the N shards one after another")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus

    if args.set == "llamacpp":
        count, selection = llamacpp_selection()
        target = 30.0
    else:
        count, selection = len(load_corpus().entries), []
        target = 600.0
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(1, args.shards + 1):
            shard = ["--chatgold-shard", f"{index}/{args.shards}"] if args.shards > 1 else []
            result = run_gate(selection + shard, Path(tmp) / f"shard-{index}")
            result["shard"] = f"{index}/{args.shards}"
            runs.append(result)
            print(f"shard {index}/{args.shards}: {result['wall_seconds']} s, {result['pytest']}", file=sys.stderr)
    slowest = max(run["wall_seconds"] for run in runs)
    out = {"set": args.set, "templates": count, "cases": len(load_cases()), "runners": RUNNERS,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
           "shards": args.shards, "runs": runs, "slowest_shard_seconds": slowest,
           "target_seconds": target, "meets_target": slowest <= target and all(r["exit_code"] == 0 for r in runs)}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(run["exit_code"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
