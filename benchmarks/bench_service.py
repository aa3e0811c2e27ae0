"""Load benchmark of the golden-file service on loopback: latency percentiles and throughput.

Starts `chatgold serve` on a free 127.0.0.1 port, then for golden fetch and check:
  * saturation: N requests from T threads as fast as possible (max requests/s);
  * paced: the target rate (default 200 requests/s) for N requests, p50/p99 latency at that rate.
Target: p99 < 20 ms at 200 requests/s. Usage: python benchmarks/bench_service.py [--requests 2000] [--threads 8]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.judge.goldens import read_golden  # noqa: E402

TEMPLATE, CASE = "01-ai-yi-1.5-9b-chat", "chat-system"


def start_server() -> tuple[subprocess.Popen, str]:
    ready = Path(tempfile.mkdtemp()) / "port"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "conformance.cli", "serve", "--port", "0", "--ready-file", str(ready)],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("service did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{ready.read_text()}"


_local = threading.local()


def _session() -> requests.Session:
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    return _local.session


def one(kind: str, base: str, payload: dict) -> float:
    start = time.perf_counter()
    if kind == "golden":
        response = _session().get(f"{base}/v1/goldens/{TEMPLATE}/{CASE}")
    else:
        response = _session().post(f"{base}/v1/check", json=payload)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"{kind}: HTTP {response.status_code}: {response.text[:200]}")
    return elapsed


def cpu_seconds(pid: int) -> float:
    """User+system CPU of the server process: per-request cost that does not depend on machine contention."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(kind: str, base: str, payload: dict, count: int, threads: int, rate: float | None, pid: int) -> dict:
    latencies: list = []
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = []
        for index in range(count):
            if rate:  # open-loop pacing: submit at the target rate regardless of response times
                due = started + index / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            futures.append(pool.submit(one, kind, base, payload))
        latencies = [f.result() for f in futures]
    wall = time.perf_counter() - started
    server_cpu = cpu_seconds(pid) - cpu_before
    ordered = sorted(latencies)
    return {"endpoint": kind, "mode": f"paced {rate:.0f}/s" if rate else f"saturation x{threads}",
            "requests": count, "requests_per_s": round(count / wall, 1),
            "p50_ms": round(1000 * statistics.median(ordered), 2),
            "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
            "max_ms": round(1000 * ordered[-1], 2), "server_cpu_ms_per_request": round(1000 * server_cpu / count, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    proc, base = start_server()
    try:
        payload = {"template": TEMPLATE, "case": CASE, "output": read_golden(TEMPLATE, CASE).text}
        for kind in ("golden", "check"):  # warm up connections and caches
            for _ in range(20):
                one(kind, base, payload)
        rows = []
        for kind in ("golden", "check"):
            rows.append(run(kind, base, payload, args.requests, args.threads, None, proc.pid))
            rows.append(run(kind, base, payload, args.requests, args.threads, args.rate, proc.pid))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'endpoint':8} {'mode':16} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'srv cpu ms/req':>14}")
        for r in rows:
            print(f"{r['endpoint']:8} {r['mode']:16} {r['requests']:>8} {r['requests_per_s']:>8} {r['p50_ms']:>8} "
                  f"{r['p99_ms']:>8} {r['max_ms']:>8} {r['server_cpu_ms_per_request']:>14}")
    paced = [r for r in rows if r["mode"].startswith("paced")]
    verdict = all(r["p99_ms"] < 20 for r in paced)
    print(f"target p99 < 20 ms at {args.rate:.0f} requests/s: {'met' if verdict else 'NOT met'} "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; client and server share them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
