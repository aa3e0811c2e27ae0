"""Load benchmark of the golden-file service on loopback: latency percentiles and throughput.

Starts `chatgold serve` on a free 127.0.0.1 port, then for golden fetch and check:
  * saturation: N requests from T threads as fast as possible (max requests/s);
  * paced: the target rate (default 200 requests/s) for N requests, p50/p99 latency at that rate.
Target: p99 < 20 ms at 200 requests/s. Usage: python benchmarks/bench_service.py [--requests 2000] [--threads 8]

Then the flood (issue #21): `GET /v1/templates` p99 from one client, idle, then while --flood-clients (200)
hostile clients in another process keep POST /v1/goldens requests in flight (a template that hangs the
reference), each resending about --flood-pause seconds (0.5x-1.5x, at random: independent clients) after an
answer, whatever Retry-After says. Target: the p99 under the flood within 2x of the idle p99. --flood-only
skips the first part.
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


HOSTILE = ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
           + "{# padding #}" * int(os.environ.get("FLOOD_PADDING", "8000")))  # hangs the reference; about 100 KB to send and parse

# The hostile clients: asyncio over raw keep-alive connections, so that the load generator (which shares the
# CPUs with the server and the measuring client) costs far less than the requests it makes the server answer.
FLOODER = r"""
import asyncio, json, random, signal, sys, time
from urllib.parse import urlsplit
base, clients, pause, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
host, port = urlsplit(base).hostname, urlsplit(base).port
body = json.dumps({"template": sys.stdin.read(), "cases": ["chat-single-user"]}).encode()
CRLF = b"\r\n"
request = CRLF.join([b"POST /v1/goldens HTTP/1.1", f"host: {host}".encode(), b"content-type: application/json",
                     f"content-length: {len(body)}".encode(), b"", body])
counts = {}

async def client(stop, ended):
    reader = writer = None
    while time.monotonic() < stop and not ended.is_set():
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(CRLF + CRLF), 60)
            status = head.split(b" ", 2)[1].decode()
            length = next((int(line.split(b":")[1]) for line in head.split(CRLF)
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if b"connection: close" in head.lower():
                writer.close()
                writer = None
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            status = "no answer"
            if writer is not None:
                writer.close()
            writer = None
        counts[status] = counts.get(status, 0) + 1
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))  # independent clients, not in lockstep
    if writer is not None:
        writer.close()

async def main():
    stop, ended = time.monotonic() + seconds, asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, ended.set)  # the benchmark ends the window
    tasks = [asyncio.create_task(client(stop, ended)) for _ in range(clients)]
    try:
        await asyncio.wait_for(ended.wait(), seconds)
    except asyncio.TimeoutError:
        pass
    await asyncio.wait(tasks, timeout=2)  # requests in flight may finish; those the reference holds do not
    for task in tasks:
        task.cancel()

asyncio.run(main())
print(json.dumps(counts))
"""


def templates_latencies(base: str, count: int) -> list:
    session = requests.Session()
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        response = session.get(f"{base}/v1/templates")
        latencies.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"GET /v1/templates: HTTP {response.status_code}")
    return sorted(latencies)


def flood(base: str, clients: int, pause: float, count: int, rounds: int = 3) -> dict:
    """GET /v1/templates p99 idle and under `clients` hostile POST /v1/goldens clients, in alternating windows
    (idle, flood, idle, flood, ...) so that a change in the machine's own load falls on both sides."""
    templates_latencies(base, 20)  # warm up
    idle, loaded, counts = [], [], {}
    per_window = max(1, count // rounds)
    for _ in range(rounds):
        idle += templates_latencies(base, per_window)
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, base, str(clients), str(pause), "600"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        flooder.stdin.write(HOSTILE)
        flooder.stdin.close()
        time.sleep(5 + pause)  # every client started, the reference busy, the first answers back
        loaded += templates_latencies(base, per_window)
        flooder.terminate()  # SIGTERM: its clients finish their current request and it prints what it got
        for status, number in json.loads(flooder.stdout.read() or "{}").items():
            counts[status] = counts.get(status, 0) + number
        flooder.wait()
    idle.sort()
    loaded.sort()

    def p99(values):
        return round(1000 * values[int(0.99 * (len(values) - 1))], 2)

    ratio = round(p99(loaded) / p99(idle), 2)
    return {"endpoint": "GET /v1/templates", "requests": len(idle) + len(loaded), "rounds": rounds,
            "idle_p50_ms": round(1000 * idle[len(idle) // 2], 2), "idle_p99_ms": p99(idle),
            "flood_p50_ms": round(1000 * loaded[len(loaded) // 2], 2), "flood_p99_ms": p99(loaded),
            "ratio": ratio, "flood_clients": clients, "flood_pause_s": pause,
            "hostile_body_bytes": len(HOSTILE), "flood_answers": counts, "target_met": ratio <= 2.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--flood-clients", type=int, default=200)
    parser.add_argument("--flood-pause", type=float, default=1.0)
    parser.add_argument("--flood-requests", type=int, default=300, help="GET /v1/templates measured per phase")
    parser.add_argument("--flood-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    proc, base = start_server()
    if args.flood_only:
        try:
            result = flood(base, args.flood_clients, args.flood_pause, args.flood_requests)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        print(json.dumps(result, indent=1) if args.json else _flood_line(result))
        return 0
    try:
        payload = {"template": TEMPLATE, "case": CASE, "output": read_golden(TEMPLATE, CASE).text}
        for kind in ("golden", "check"):  # warm up connections and caches
            for _ in range(20):
                one(kind, base, payload)
        rows = []
        for kind in ("golden", "check"):
            rows.append(run(kind, base, payload, args.requests, args.threads, None, proc.pid))
            rows.append(run(kind, base, payload, args.requests, args.threads, args.rate, proc.pid))
        flooded = flood(base, args.flood_clients, args.flood_pause, args.flood_requests)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    if args.json:
        print(json.dumps({"rows": rows, "flood": flooded}, indent=1))
    else:
        print(f"{'endpoint':8} {'mode':16} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'srv cpu ms/req':>14}")
        for r in rows:
            print(f"{r['endpoint']:8} {r['mode']:16} {r['requests']:>8} {r['requests_per_s']:>8} {r['p50_ms']:>8} "
                  f"{r['p99_ms']:>8} {r['max_ms']:>8} {r['server_cpu_ms_per_request']:>14}")
    paced = [r for r in rows if r["mode"].startswith("paced")]
    verdict = all(r["p99_ms"] < 20 for r in paced)
    print(f"target p99 < 20 ms at {args.rate:.0f} requests/s: {'met' if verdict else 'NOT met'} "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; client and server share them)")
    print(_flood_line(flooded))
    return 0


def _flood_line(result: dict) -> str:
    return (f"{result['endpoint']} p99 idle {result['idle_p99_ms']} ms, under {result['flood_clients']} hostile "
            f"POST /v1/goldens clients {result['flood_p99_ms']} ms: {result['ratio']}x (target <= 2x: "
            f"{'met' if result['target_met'] else 'NOT met'}); flood answers {result['flood_answers']}")


if __name__ == "__main__":
    sys.exit(main())
