"""The service's expensive work, kept away from its request threads: bounded, fail-fast pools.

Rendering new goldens (the reference) and attributing divergences (the evaluator's traced render) run untrusted
template code. Each kind has a WorkPool: a fixed number of worker threads, each owning one out-of-process
resource (a warm reference harness, an attribution worker process; both memory-capped, time-limited and
niced below the server), behind a queue of at most `capacity` waiting jobs. A job that finds the queue full is
refused at once (Busy: the endpoint answers 503 with Retry-After) instead of waiting, so a flood of expensive
requests never holds the server's request threads and the cheap endpoints keep their latency.

RateLimiter is the per-client token bucket the service applies when it is reachable beyond this machine.
"""
from __future__ import annotations

import concurrent.futures
import math
import queue
import threading
import time
from typing import Any, Callable, Optional


class Busy(Exception):
    """The pool's queue is full: retry after `retry_after` seconds."""

    def __init__(self, pool: str, retry_after: int):
        super().__init__(f"the service is busy ({pool}: every worker is taken and the queue is full); retry "
                         f"after {retry_after} s")
        self.retry_after = retry_after


class WorkPool:
    """`workers` threads, each with its own resource from `make_resource()`, taking jobs from a bounded queue.

    submit(job) -> concurrent.futures.Future of job(resource); raises Busy when `capacity` jobs already wait."""

    def __init__(self, name: str, make_resource: Callable[[], Any], workers: int = 1, capacity: int = 4,
                 retry_after: int = 5):
        self.name = name
        self.retry_after = retry_after
        self._make = make_resource
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue(maxsize=max(1, capacity))
        self._resources: list = []
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-worker", daemon=True)
                         for _ in range(max(1, workers))]
        for thread in self._threads:
            thread.start()

    def full(self) -> bool:
        return self._queue.full()

    def submit(self, job: Callable[[Any], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            raise Busy(self.name, self.retry_after)
        try:
            self._queue.put_nowait((job, future))
        except queue.Full:
            raise Busy(self.name, self.retry_after) from None
        return future

    def _serve(self) -> None:
        resource = None
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if resource is None:
                        resource = self._make()
                        with self._lock:
                            self._resources.append(resource)
                    future.set_result(job(resource))
                except BaseException as exc:  # the job's own failure goes to its caller
                    future.set_exception(exc)
        finally:
            if resource is not None:
                _close(resource)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:  # refuse what still waits, then stop every worker
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        for _ in self._threads:
            try:
                self._queue.put(None, timeout=1)
            except queue.Full:
                break
        # End the worker processes first: a job still running then fails at once instead of finishing.
        with self._lock:
            resources, self._resources = self._resources, []
        for resource in resources:
            _close(resource)
        for thread in self._threads:
            thread.join(timeout=10)


def _close(resource) -> None:
    try:
        resource.close()
    except Exception:  # closing is best effort: the process tree is ended at exit anyway
        pass


class RateLimiter:
    """Token bucket per client address: `rate` requests per second, bursts of `burst`."""

    def __init__(self, rate: float, burst: Optional[int] = None):
        self.rate = rate
        self.burst = burst or max(1, int(rate * 2))
        self._buckets: dict = {}
        self._lock = threading.Lock()

    def allow(self, client: str) -> float:
        """0 when the request may go ahead, else the seconds until it would."""
        now = time.monotonic()
        with self._lock:
            tokens, stamp = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                wait = 0.0
            else:
                self._buckets[client] = (tokens, now)
                wait = (1 - tokens) / self.rate
            if len(self._buckets) > 10000:  # forget idle clients (a full bucket is the same as none)
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < self.burst / self.rate}
        return wait

    @staticmethod
    def retry_after(wait: float) -> str:
        return str(max(1, math.ceil(wait)))
