"""The service's connection limits (issue 32 items 2, 3 and 6), on a real `chatgold serve` in a subprocess:
connections that send nothing or half a request are closed (408) and bounded per client address, refusals are
logged once rather than per connection, a request's line and headers are bounded (431) without the server
growing, and no error body holds the bare NaN/Infinity strict JSON parsers reject."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import requests
from service_support import start_service, stop_service

from conformance.service.limits import HEADER_SECONDS, MAX_CONNECTIONS_PER_CLIENT, MAX_HEADER_BYTES
from conformance.service.middleware import BodyLimit, ConnectionBook


@pytest.fixture(scope="module")
def service():
    proc, url = start_service()
    yield proc, url
    stop_service(proc)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", _port(url)), timeout=30, source_address=(source, 0))
    return sock


def _answer(sock: socket.socket, timeout: float = 30) -> tuple:
    """(status, JSON body) of the one response on a socket the server closes after it."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), data[:200]
    return int(head.split()[1]), json.loads(body, parse_constant=_strict)


def _strict(name):
    raise AssertionError(f"{name} is not JSON")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_idle_and_half_open_connections_are_closed_and_bounded_per_client(service):
    proc, url = service
    started = time.monotonic()
    idle = [_connect(url) for _ in range(MAX_CONNECTIONS_PER_CLIENT - 1)]
    half = _connect(url)
    half.sendall(b"GET /v1/cases HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # half a request, never finished
    # One more from the same address is refused at once; so are many more (and logged once, below).
    for _ in range(40):
        extra = _connect(url)
        status, body = _answer(extra, timeout=10)
        assert status == 503 and "per client address" in body["detail"]
        extra.close()
    # Another client address is served meanwhile.
    session = requests.Session()
    session.mount("http://", _SourceAdapter("127.0.0.2"))
    assert session.get(f"{url}/v1/cases", timeout=10).status_code == 200
    # Within the header time limit (and a margin) the idle and the half-open connections get 408 and close.
    for sock in idle + [half]:
        status, body = _answer(sock, timeout=HEADER_SECONDS + 20)
        assert status == 408 and "within" in body["detail"]
        sock.close()
    assert time.monotonic() - started < HEADER_SECONDS + 20
    # Their places are free again.
    assert requests.get(f"{url}/v1/cases", timeout=10).status_code == 200


class _SourceAdapter(requests.adapters.HTTPAdapter):
    """Connections from another loopback address (127.0.0.2): a second client, to the server."""

    def __init__(self, source: str):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


@pytest.mark.parametrize("size", [MAX_HEADER_BYTES + 1, 32 * 1024 * 1024])
def test_oversized_headers_get_431(service, size):
    _, url = service
    sock = _connect(url, "127.0.0.3")
    request = b"GET /v1/cases HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    try:
        sock.sendall(request)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before all of it was sent
    status, body = _answer(sock)
    assert status == 431 and str(MAX_HEADER_BYTES) in body["detail"]
    # Headers within the limit pass.
    fine = requests.get(f"{url}/v1/cases", headers={"X-Fine": "a" * (MAX_HEADER_BYTES // 2)}, timeout=10)
    assert fine.status_code == 200


def test_a_streamed_huge_header_does_not_grow_the_server(service):
    proc, url = service
    before = _rss_mb(proc.pid)
    sock = _connect(url, "127.0.0.4")
    sock.sendall(b"GET /v1/cases HTTP/1.1\r\nHost: x\r\nX-Huge: ")
    sent = 0
    chunk = b"b" * 65536
    try:
        while sent < 300 * 1024 * 1024:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 16 * 1024 * 1024, "the server went on reading a header far past its limit"
    sock.close()
    assert _rss_mb(proc.pid) - before < 20
    assert requests.get(f"{url}/v1/cases", timeout=10).status_code == 200


def test_nan_and_infinity_are_never_echoed_as_bare_json(service):
    _, url = service
    for raw in (b'{"template": NaN, "case": "x", "output": "y"}', b'{"template": "t", "case": Infinity, '
                                                                   b'"output": -Infinity}',
                b'{"cells": [{"template": NaN}], "attribute": Infinity}'):
        path = "/v1/check/batch" if b"cells" in raw else "/v1/check"
        answer = requests.post(url + path, data=raw, headers={"content-type": "application/json"}, timeout=10)
        assert answer.status_code == 422
        assert b"NaN" not in answer.content and b"Infinity" not in answer.content
        json.loads(answer.content, parse_constant=_strict)


def test_refused_connections_are_logged_once(tmp_path):
    proc, url = start_service()
    try:
        held = [_connect(url) for _ in range(MAX_CONNECTIONS_PER_CLIENT)]
        for _ in range(200):
            extra = _connect(url)
            assert _answer(extra, timeout=10)[0] == 503
            extra.close()
        for sock in held:
            sock.close()
    finally:
        stop_service(proc)
    log = proc.stdout.read().decode(errors="replace")
    assert log.count("refusing connections") == 1, log
    assert "Traceback" not in log and len(log) < 4000, log


def test_connection_book_bounds_clients_and_the_total():
    book = ConnectionBook(per_client=2, total=3)
    assert book.admit("a") is None and book.admit("a") is None
    assert "per client" in book.admit("a")
    assert book.admit("b") is None
    assert "3 open connections" in book.admit("c")
    book.release("a")
    assert book.admit("c") is None and book.count == 3


def test_a_body_that_does_not_arrive_in_time_gets_408():
    sent = []

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the app ran")

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    limit = BodyLimit(app, seconds=0.2)
    started = time.monotonic()
    asyncio.run(limit({"type": "http", "headers": []}, receive, send))
    assert time.monotonic() - started < 5
    assert sent[0]["status"] == 408 and b"did not arrive" in sent[1]["body"]


def test_running_out_of_descriptors_while_accepting_is_logged_once(caplog, monkeypatch):
    import errno
    import logging

    import conformance.service.middleware as middleware

    monkeypatch.setattr(middleware, "log_once", middleware.LogOnce())  # nothing said yet in this process
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
            for _ in range(500):
                middleware.quiet_exception_handler(loop, {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files")})
    finally:
        loop.close()
    said = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(said) == 1 and "Too many open files" in said[0].getMessage()
