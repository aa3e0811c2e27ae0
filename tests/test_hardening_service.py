"""Hardening of the golden-file service (issue #21 items 2-4), on a real `chatgold serve` in a subprocess:
attribution of a hostile template does not grow the server, a flood of reference requests is refused at once
and never starves the cheap reads, every error body is JSON whatever the request held, and beyond loopback a
token and a rate limit are required."""
from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from service_support import start_service, stop_service

from conformance import repo_root
from conformance.corpus.manifest import TemplateEntry, sha256_text
from conformance.service.server import GOLDENS_QUEUE, GOLDENS_WORKERS

CASE = "chat-single-user"
GOLDEN = "Hello! What is the capital of France?"
TOKEN = "test-token"
# Rendered within every evaluator limit, but about 150 MB while it does (four texts of 30 Mi characters, with
# their provenance): what attribution costs the process that runs it.
HEAVY = ("{% set a = 'x' * 30000000 %}{% set b = a ~ 'y' %}{% set c = b ~ 'z' %}{% set d = c ~ 'w' %}"
         "{% if d|length > 4 %}{{ messages[0].content }}{% endif %}")
HANG = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


def _root(tmp: Path) -> Path:
    """A checkout with one corpus template (HEAVY) and its golden."""
    templates, goldens = tmp / "templates", tmp / "goldens"
    templates.mkdir()
    entry = TemplateEntry(id="heavy", sha256=sha256_text(HEAVY.encode()), file="heavy.jinja", family="test")
    (templates / "heavy.jinja").write_text(HEAVY)
    (templates / "manifest.json").write_text(json.dumps({"format": 1, "sources": {},
                                                         "templates": [entry.to_dict()]}))
    (goldens / "heavy").mkdir(parents=True)
    (goldens / "heavy" / f"{CASE}.txt").write_text(GOLDEN)
    return tmp


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = _root(tmp_path_factory.mktemp("hostile"))
    proc, url = start_service("--token", TOKEN, "--rate-limit", "10000", root=root)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    yield proc, url, session
    stop_service(proc)


def _peak_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) // 1024


def test_attribution_of_a_hostile_template_does_not_grow_the_server(service):
    proc, url, session = service
    body = {"template": "heavy", "case": CASE, "output": GOLDEN.replace("France", "Spain")}
    session.get(f"{url}/v1/templates", timeout=30).raise_for_status()
    before = _peak_mb(proc.pid)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: session.post(f"{url}/v1/check", json=body, timeout=300), range(6)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["status"] == "diverged" and result["attribution"] is not None
    # At least one was attributed for real (the rest may have found the attribution queue full).
    assert any(a.json()["attribution"].get("line") == 1 for a in answers), [a.json()["attribution"] for a in answers]
    grown = _peak_mb(proc.pid) - before
    assert grown < 60, f"the server grew by {grown} MB while attributing (before: about 900 MB per request)"


@pytest.mark.parametrize("body", [
    b'{"template": "\\ud800", "case": 5, "output": "x"}',              # a lone surrogate echoed by the 422
    b'{"template": "\\ud800", "case": "\\udfff", "output": "\\ud800"}',  # ... in ids and output
    b'{"template": "heavy", "case": "' + CASE.encode() + b'", "output": "\\ud800"}',
    b'{"template": "\xff\xfe"}',                                        # not UTF-8
    b'{"a": ' + b'[' * 100000 + b']' * 100000 + b'}',                   # nested past the parser
    b'[' * 5000 + b']' * 5000,
    b'\x00\x01\x02',
    b'',
])
def test_every_error_body_is_json(service, body):
    _, url, session = service
    for path in ("/v1/check", "/v1/goldens", "/v1/identify", "/v1/check/batch"):
        answer = session.post(url + path, data=body, headers={"content-type": "application/json"}, timeout=60)
        busy = answer.status_code == 503 and "Retry-After" in answer.headers  # documented: the queue is full
        assert answer.status_code < 500 or busy, (path, body[:40], answer.status_code, answer.text[:300])
        assert answer.headers["content-type"].startswith("application/json"), (path, answer.text[:200])
        assert "detail" in answer.json() or answer.status_code == 200
        if answer.status_code >= 400 and body.startswith((b"{\"a\"", b"[[")):
            assert answer.status_code == 422, (path, answer.status_code)  # as docs/service.md says


def test_malformed_http_and_unknown_routes_get_json(service):
    _, url, session = service
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"GET /v1/templates HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head.lower(), reply[:300]
    assert "malformed HTTP request" in json.loads(body)["detail"]
    for method, path in (("GET", "/nowhere"), ("DELETE", "/v1/templates"), ("GET", "/v1/goldens/%00/x")):
        answer = session.request(method, url + path, timeout=10)
        assert 400 <= answer.status_code < 500 and answer.json()["detail"], (method, path, answer.text)


def test_the_token_is_required(service):
    _, url, _ = service
    bare = requests.get(f"{url}/v1/templates", timeout=10)
    assert bare.status_code == 401 and bare.json()["detail"] and bare.headers["WWW-Authenticate"] == "Bearer"
    wrong = requests.get(f"{url}/v1/templates", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    assert requests.get(f"{url}/openapi.json", timeout=10).status_code == 200  # the contract stays public


# Last of the tests on the module's service: the jobs it queued keep the reference busy for a while.
def test_a_flood_of_reference_requests_is_refused_at_once_and_reads_stay_fast(service):
    _, url, session = service
    templates = f"{url}/v1/templates"
    session.get(templates, timeout=30).raise_for_status()

    def post(_):
        started = time.monotonic()
        try:
            answer = session.post(f"{url}/v1/goldens", json={"template": HANG, "cases": [CASE]}, timeout=10)
        except requests.Timeout:
            return "queued", time.monotonic() - started, None
        return answer.status_code, time.monotonic() - started, answer

    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        posts = [pool.submit(post, i) for i in range(200)]
        reads = []
        for _ in range(20):
            started = time.monotonic()
            session.get(templates, timeout=60).raise_for_status()
            reads.append(time.monotonic() - started)
        results = [p.result() for p in posts]
    refused = [r for r in results if r[0] == 503]
    # Only the reference's workers and its queue take jobs; everything else is refused without waiting.
    assert len(refused) >= 200 - (GOLDENS_WORKERS + GOLDENS_QUEUE), [r[0] for r in results]
    for _, seconds, answer in refused:
        assert int(answer.headers["Retry-After"]) > 0 and "busy" in answer.json()["detail"]
        assert seconds < 10
    assert max(reads) < 5, f"GET /v1/templates took up to {max(reads):.2f} s during the flood (before: 133 s)"


def test_binding_beyond_loopback_needs_a_token():
    env = {k: v for k, v in os.environ.items() if k != "CHATGOLD_SERVICE_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "conformance.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                          cwd=repo_root(), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "token" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_rate_limit_answers_429_with_retry_after(tmp_path):
    proc, url = start_service("--rate-limit", "2", root=_root(tmp_path))
    try:
        codes = [requests.get(f"{url}/v1/cases/{CASE}", timeout=10) for _ in range(12)]
    finally:
        stop_service(proc)
    limited = [a for a in codes if a.status_code == 429]
    assert limited and codes[0].status_code == 200
    assert int(limited[0].headers["Retry-After"]) >= 1 and "rate limit" in limited[0].json()["detail"]
