"""The conformance gate's wall time, measured by running it: `pytest --pyargs conformance.gate` with every runner.

    python benchmarks/bench_gate.py [--set llamacpp|full] [--scenarios cold,warm,one-change] [--shards N]
                                    [--store DIR] [--out gate.json]

The issue's targets, one run on one (warm) store:
    python benchmarks/bench_gate.py --store ~/.cache/chatgold/results --scenarios warm,warm-full,one-change

--set llamacpp: the templates llama.cpp ships (its models/templates and vocab GGUFs) x all cases x all
runners. --set full: the whole corpus. Scenarios run one after another on one result store (a fresh temporary
one, so the first run is really cold): cold (empty store: every cell rendered), warm (nothing changed: every
outcome from the store), one-change (one template's bytes changed, as a pull request would: its cells are
rendered by every runner, the rest come from the store; the change is a leading Jinja comment, so the goldens
still hold), verify (warm, but --chatgold-verify-reference: the reference renders every golden again),
warm-full (warm, the whole corpus whatever --set says: the full gate as CI runs it), reconfirm (warm, but
--chatgold-reconfirm-causes: every known cause's reproducer rendered again, as the scheduled run does).
Every run writes the gate's per-stage wall and CPU seconds (--chatgold-timings: render, judge, tokens, explain,
properties, capabilities, agreement, report; CPU of the gate's own threads) beside the per-process CPU;
--no-stage-timings leaves the option out (a checkout older than it).
--shards N runs the N shards (`--chatgold-shard I/N`) one after another and reports each: on an N-machine CI
matrix the gate takes the slowest shard's time. The per-process CPU of the run comes from /proc (the gate and
every engine it starts), so the report says where the time went; the machine's load average is recorded
beside each run, since other work on the machine stretches wall times.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from runners.versions import cache_root  # noqa: E402


def _tox_runners() -> list:
    """The runners tox.ini's conformance environment checks (the gate as CI runs it), in its order."""
    text = (ROOT / "tox.ini").read_text(encoding="utf-8")
    section = text.split("[testenv:conformance]", 1)[1].split("\n[", 1)[0]
    return re.findall(r"--chatgold-runner\s+(\S+)", section)


RUNNERS = _tox_runners()
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


STORE_LINE = re.compile(r"chatgold: result store .*?: (\d+) cells reused, (\d+) rendered")


def run_gate(selection: list, report_dir: Path, env_extra: Optional[dict] = None, extra: tuple = (),
             timings: bool = True) -> dict:
    # As tox.ini's conformance environment runs it.
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:schemathesis", "-p",
            "no:hypothesispytest", "-p", "no:xdist", "-p", "no:logging", "--assert=plain", "-q", "--pyargs",
            "conformance.gate",
            "--snapshot-warn-unused", f"--chatgold-report={report_dir}"]
    for runner in RUNNERS:
        argv += ["--chatgold-runner", runner]
    argv += selection + list(extra)
    timings_file = report_dir.parent / f"{report_dir.name}.timings.json"
    if timings:
        argv += [f"--chatgold-timings={timings_file}"]
    env = {**os.environ, "CHATGOLD_ROOT": str(ROOT), **(env_extra or {})}  # env_extra may move the root
    # Bytecode as tox.ini's environment has it: cached outside the checkout, whatever this shell says.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(cache_root() / "pycache"))
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = CpuSampler(proc.pid)
        code = proc.wait()
        cpu = sampler.stop()
        log.seek(0)
        output = log.read().decode("utf-8", "replace")
    wall = time.perf_counter() - started
    lines = output.strip().splitlines()
    store = STORE_LINE.search(output)
    stages = json.loads(timings_file.read_text()) if timings and timings_file.exists() else None
    return {"wall_seconds": round(wall, 1), "exit_code": code, "pytest": lines[-1] if lines else "",
            "cpu_seconds": cpu, "cpu_total": round(sum(cpu.values()), 1),
            "cells_reused": int(store.group(1)) if store else None,
            "cells_rendered": int(store.group(2)) if store else None,
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
            **({"session": stages["session"], "stages": stages["by_stage"]} if stages else {})}


# The targets (wall seconds): warm llama.cpp set, warm full gate, one change beyond warm.
TARGETS = {"warm": 10.0, "warm-full": 60.0, "one-change": 30.0}


def judge_targets(by_scenario: dict, loads: dict) -> dict:
    """Each target met or not. A figure over its target on a loaded machine (load average above the CPU count
    at its start or end) is inconclusive, never a pass: other work only stretches wall time."""
    verdicts = {}
    cpus = os.cpu_count() or 1
    for scenario, target in TARGETS.items():
        if scenario not in by_scenario:
            continue
        figure = by_scenario[scenario]
        if scenario == "one-change":
            if "warm" not in by_scenario:
                continue
            figure = round(figure - by_scenario["warm"], 1)
        load = max(loads.get(scenario, [0.0]))
        if figure <= target:
            verdict = "met"
        elif load > cpus:
            verdict = f"not met on a loaded machine (load {load}): inconclusive"
        else:
            verdict = "not met"
        verdicts[scenario] = {"seconds": figure, "target": target, "load_average": loads.get(scenario),
                              "verdict": verdict}
    return verdicts


def llamacpp_selection() -> tuple:
    from bench_matrix import llamacpp_set

    from conformance.corpus.manifest import load_corpus

    templates = llamacpp_set(load_corpus())
    selection = []
    for entry in templates:
        selection += ["--chatgold-template", entry.id]
    return len(templates), selection


def changed_root(tmp: Path, template_ids: list) -> tuple:
    """A checkout root whose templates/ is a copy with one template changed (a leading Jinja comment: new bytes,
    same output) and whose goldens/ is this checkout's. Returns (root, the changed template's id)."""
    from conformance.corpus.manifest import templates_dir

    root = tmp / "changed-root"
    shutil.copytree(templates_dir(), root / "templates")
    (root / "goldens").symlink_to(ROOT / "goldens")
    for template_id in template_ids:
        path = root / "templates" / f"{template_id}.jinja"
        source = path.read_bytes()
        if source[:1] in (b"{", b"<"):  # no leading newline that a comment's trim_blocks could swallow
            # A new comment each run: a change an earlier run stored would be warm.
            path.write_bytes(b"{# chatgold benchmark: this template changed %d #}" % time.time_ns() + source)
            return root, template_id
    raise RuntimeError("no template to change")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("llamacpp", "full"), default="llamacpp")
    parser.add_argument("--scenarios", default="cold,warm",
                        help="comma-separated, in order: cold, warm, one-change, verify (default cold,warm)")
    parser.add_argument("--shards", type=int, default=1, help="run the N shards one after another")
    parser.add_argument("--store", help="the result store to use (default: a fresh temporary one)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--no-stage-timings", action="store_true",
                        help="do not ask the gate for its per-stage timings (a checkout without the option)")
    args = parser.parse_args(argv)

    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus

    corpus = load_corpus()
    if args.set == "llamacpp":
        count, selection = llamacpp_selection()
        template_ids = [selection[i + 1] for i in range(0, len(selection), 2)]
    else:
        count, selection = len(corpus.entries), []
        template_ids = [e.id for e in corpus.entries]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - {"cold", "warm", "one-change", "verify", "warm-full", "reconfirm"}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {"CHATGOLD_RESULTS_DIR": str(Path(args.store).resolve() if args.store else tmp / "store")}
        for scenario in scenarios:
            extra_env, extra, note = dict(env), [], None
            if scenario == "one-change":
                root, changed = changed_root(tmp / scenario, template_ids)
                extra_env["CHATGOLD_ROOT"] = str(root)
                note = f"changed {changed}"
            if scenario == "verify":
                extra.append("--chatgold-verify-reference")
            if scenario == "reconfirm":
                extra.append("--chatgold-reconfirm-causes")
            chosen = [] if scenario == "warm-full" else selection
            for index in range(1, args.shards + 1):
                shard = ["--chatgold-shard", f"{index}/{args.shards}"] if args.shards > 1 else []
                result = run_gate(chosen + shard, tmp / f"{scenario}-{index}", extra_env, tuple(extra),
                                  timings=not args.no_stage_timings)
                result.update(scenario=scenario, shard=f"{index}/{args.shards}")
                if note:
                    result["note"] = note
                runs.append(result)
                print(f"{scenario} shard {index}/{args.shards}: {result['wall_seconds']} s, {result['cpu_total']} CPU-s, "
                      f"{result['cells_reused']} reused / {result['cells_rendered']} rendered, {result['pytest']}, "
                      f"load {result['load_average']}", file=sys.stderr)
    by_scenario, loads = {}, {}
    for run in runs:
        by_scenario[run["scenario"]] = max(by_scenario.get(run["scenario"], 0.0), run["wall_seconds"])
        loads.setdefault(run["scenario"], []).extend(run["load_average"])
    out = {"set": args.set, "templates": count, "cases": len(load_cases()), "runners": RUNNERS,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
           "shards": args.shards, "runs": runs, "slowest_shard_seconds": by_scenario,
           "targets": judge_targets(by_scenario, loads)}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    # Divergences the baselines do not know fail the gate; that is the gate's verdict, not the benchmark's.
    return 0


if __name__ == "__main__":
    sys.exit(main())
