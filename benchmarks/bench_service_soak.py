"""Soak benchmark of the golden-file service's connection limits (issue 32), on loopback only.

Starts `chatgold serve` on a free 127.0.0.1 port. A normal client (source address 127.0.0.2, one keep-alive
connection) fetches a golden at a steady rate and records every latency: first with the server idle, then while
a second process runs hostile clients at the server's limits for --seconds (longer than the header time limit,
so their connections are cut and reopened):

  * idle: MAX_CONNECTIONS_PER_CLIENT connections from 127.0.0.1 that send nothing, reopened when closed, and
    --extra attempts a second beyond the limit (each refused with 503);
  * half-open: as many from 127.0.0.3 that send half a request line and headers, a byte a second;
  * oversized headers: --oversized clients from 127.0.0.4 sending 128 KiB of headers, again and again (431).

Target: the normal client's GET p99 under the soak within 2x of its idle p99, and no request of it lost (every
answer 200, none refused or timed out). Also reported: what the hostile clients were answered, the server's
resident memory before and after, and how many lines the server logged. Every loop is bounded in time.

Usage: python benchmarks/bench_service_soak.py [--seconds 25] [--rate 50] [--json out.json]
(`python -m benchmarks` runs it too.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.service.limits import HEADER_SECONDS, MAX_CONNECTIONS_PER_CLIENT, MAX_HEADER_BYTES  # noqa: E402

TEMPLATE, CASE = "01-ai-yi-1.5-9b-chat", "chat-system"


def start_server(log: Path) -> tuple:
    ready = Path(tempfile.mkdtemp()) / "port"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "conformance.cli", "serve", "--port", "0", "--ready-file",
                             str(ready)], cwd=ROOT, env=env, start_new_session=True, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("service did not start")
        time.sleep(0.05)
    return proc, int(ready.read_text())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


class _Source(requests.adapters.HTTPAdapter):
    def __init__(self, source: str):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def measure(port: int, seconds: float, rate: float) -> dict:
    """The normal client: GET a golden every 1/rate s for `seconds`; latencies of the 200s, and what was lost."""
    session = requests.Session()
    session.mount("http://", _Source("127.0.0.2"))
    url = f"http://127.0.0.1:{port}/v1/goldens/{TEMPLATE}/{CASE}"
    latencies, lost = [], []
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            answer = session.get(url, timeout=10)
            if answer.status_code == 200:
                latencies.append(time.perf_counter() - start)
            else:
                lost.append(f"HTTP {answer.status_code}")
        except requests.RequestException as exc:
            lost.append(type(exc).__name__)
        next_at += 1 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) if latencies else None

    return {"requests": len(latencies) + len(lost), "ok": len(latencies), "lost": len(lost),
            "lost_kinds": sorted(set(lost)), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


# -- the hostile clients (a separate process: python -m ... --hostile PORT SECONDS EXTRA OVERSIZED) ------------

async def _status(reader, timeout: float):
    """The status code of the answer on a connection (None when closed without one)."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None
    except (asyncio.TimeoutError, ConnectionError, ValueError, IndexError):
        return None


async def hostile(port: int, seconds: float, extra: int, oversized: int) -> dict:
    end = time.monotonic() + seconds
    counts: dict = {}

    def count(kind: str, status) -> None:
        key = f"{kind}:{status}"
        counts[key] = counts.get(key, 0) + 1

    async def connect(source: str):
        return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))

    async def idle_one():
        while time.monotonic() < end:
            try:
                reader, writer = await connect("127.0.0.1")
            except OSError as exc:
                count("idle", type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            count("idle", await _status(reader, max(0.1, end - time.monotonic())))
            writer.close()

    async def half_one():
        while time.monotonic() < end:
            try:
                reader, writer = await connect("127.0.0.3")
            except OSError as exc:
                count("half-open", type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            writer.write(b"GET /v1/cases HTTP/1.1\r\nHost: x\r\n")
            answered = asyncio.ensure_future(_status(reader, max(0.1, end - time.monotonic())))
            while not answered.done() and time.monotonic() < end:
                try:
                    writer.write(b"X")  # a byte a second: never a complete header line
                    await writer.drain()
                except ConnectionError:
                    break
                await asyncio.wait([answered], timeout=1.0)
            count("half-open", await answered)
            writer.close()

    async def beyond():
        while time.monotonic() < end:
            try:
                reader, writer = await connect("127.0.0.1")
                count("beyond-limit", await _status(reader, 5))
                writer.close()
            except OSError as exc:
                count("beyond-limit", type(exc).__name__)
            await asyncio.sleep(1 / extra)

    async def oversized_one():
        header = b"GET /v1/cases HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEADER_BYTES) + b"\r\n\r\n"
        while time.monotonic() < end:
            try:
                reader, writer = await connect("127.0.0.4")
                writer.write(header)
                count("oversized", await _status(reader, 10))
                writer.close()
            except OSError as exc:
                count("oversized", type(exc).__name__)
            await asyncio.sleep(0.05)

    tasks = [idle_one() for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
    tasks += [half_one() for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
    tasks += [oversized_one() for _ in range(oversized)]
    tasks.append(beyond())
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), seconds + 30)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=max(25.0, 2.5 * HEADER_SECONDS))
    parser.add_argument("--rate", type=float, default=50.0, help="normal client's requests per second")
    parser.add_argument("--extra", type=int, default=50, help="connection attempts per second beyond the limit")
    parser.add_argument("--oversized", type=int, default=4, help="clients sending oversized headers")
    parser.add_argument("--json", "--out", dest="json", help="write the figures here")
    for ignored in ("--templates", "--cases"):  # run_all passes the corpus slice to every benchmark
        parser.add_argument(ignored, help=argparse.SUPPRESS)
    parser.add_argument("--hostile", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hostile:
        counts = asyncio.run(hostile(int(args.hostile[0]), float(args.hostile[1]), args.extra, args.oversized))
        print(json.dumps(counts))
        return 0

    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, port = start_server(log)
    try:
        requests.get(f"http://127.0.0.1:{port}/v1/goldens/{TEMPLATE}/{CASE}", timeout=30)  # warm
        rss_before = rss_mb(proc.pid)
        idle = measure(port, min(args.seconds, 15.0), args.rate)
        soak = subprocess.Popen([sys.executable, __file__, "--hostile", str(port), str(args.seconds),
                                 "--extra", str(args.extra), "--oversized", str(args.oversized)],
                                stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)  # the hostile clients at the limits before measuring
        loaded = measure(port, args.seconds - 1.0, args.rate)
        out, _ = soak.communicate(timeout=args.seconds + 60)
        counts = json.loads(out or "{}")
        rss_after = rss_mb(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    lines = log.read_text(errors="replace").splitlines()
    ratio = round(loaded["p99_ms"] / idle["p99_ms"], 2) if idle["p99_ms"] and loaded["p99_ms"] else None
    result = {"idle": idle, "soak": loaded, "p99_ratio": ratio, "hostile_answers": counts,
              "server_rss_mb": {"before": round(rss_before, 1), "after": round(rss_after, 1)},
              "server_log_lines": len(lines), "server_log": lines[:20],
              "limits": {"per_client": MAX_CONNECTIONS_PER_CLIENT, "header_bytes": MAX_HEADER_BYTES,
                         "header_seconds": HEADER_SECONDS},
              "target": "soak p99 <= 2x idle p99, nothing lost",
              "passed": bool(ratio is not None and ratio <= 2.0 and loaded["lost"] == 0 and idle["lost"] == 0)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
