"""The golden-file service, started for real (`chatgold serve` in a subprocess on 127.0.0.1) and driven over HTTP."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest
import requests
from service_support import start_service, stop_service

from conformance import repo_root
from conformance.corpus.cases import load_cases
from conformance.corpus.manifest import load_corpus
from conformance.judge.goldens import read_golden
from conformance.report import load_report
from conformance.service.client import ServiceClient, ServiceError
from conformance.service.server import (
    MAX_BATCH_CELLS,
    MAX_BODY_BYTES,
    MAX_TEMPLATE_BYTES,
)

TEMPLATE = "01-ai-yi-1.5-9b-chat"       # renders ChatML; refuses image content parts
RENDERED_CASE = "chat-single-user"
RAISED_CASE = "content-parts-image"


@pytest.fixture(scope="module")
def server():
    proc, url = start_service()
    yield url
    stop_service(proc)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_fixture_cells_are_what_the_tests_assume():
    assert read_golden(TEMPLATE, RENDERED_CASE).kind == "rendered"
    assert read_golden(TEMPLATE, RAISED_CASE).kind == "raised"


def test_openapi_document_describes_every_endpoint(server):
    doc = requests.get(f"{server}/openapi.json", timeout=10).json()
    assert set(doc["paths"]) == {"/v1/templates", "/v1/templates/{template_id}", "/v1/cases", "/v1/cases/{case_id}",
                                 "/v1/goldens/{template_id}/{case_id}", "/v1/check", "/v1/check/batch",
                                 "/v1/goldens", "/v1/identify", "/v1/compat"}
    for name in ("CheckRequest", "CheckResult", "GoldenJSON", "TemplateDetail", "IdentifyResult", "ErrorBody"):
        assert name in doc["components"]["schemas"]


def test_templates_and_template_detail(server, corpus):
    listed = requests.get(f"{server}/v1/templates", timeout=30).json()
    assert listed["count"] == len(corpus.entries)
    one = requests.get(f"{server}/v1/templates", params={"template": "01-ai-*", "detail": "true"}, timeout=30).json()
    assert {t["id"] for t in one["templates"]} == {e.id for e in corpus.select(["01-ai-*"])}
    assert all(t["constructs"] or t["notes"] for t in one["templates"])
    detail = requests.get(f"{server}/v1/templates/{TEMPLATE}", timeout=10).json()
    entry = corpus.get(TEMPLATE)
    assert detail["source"] == entry.source()
    assert detail["sha256"] == hashlib.sha256(entry.source_bytes()).hexdigest()
    assert (detail["bos_token"], detail["eos_token"], detail["family"]) == (entry.bos_token, entry.eos_token, entry.family)
    if detail["capabilities"] is None:
        assert any("capabilities" in n for n in detail["notes"]) or not (
            repo_root() / "goldens" / TEMPLATE / "capabilities.json").exists()
    else:
        assert detail["capabilities"]["format"] == 2
    if detail["constructs"] is None:
        assert any("constructs unavailable" in n for n in detail["notes"])
    else:
        assert "op:add" in detail["constructs"]


def test_cases(server):
    cases = {c.id: c for c in load_cases()}
    listed = requests.get(f"{server}/v1/cases", timeout=10).json()
    assert listed["count"] == len(cases)
    got = requests.get(f"{server}/v1/cases/{RENDERED_CASE}", timeout=10).json()
    assert got == cases[RENDERED_CASE].to_dict()


def test_golden_bytes_and_refusal_marker(server):
    response = requests.get(f"{server}/v1/goldens/{TEMPLATE}/{RENDERED_CASE}", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["X-Chatgold-Outcome"] == "rendered"
    assert response.content == read_golden(TEMPLATE, RENDERED_CASE).data
    raised = requests.get(f"{server}/v1/goldens/{TEMPLATE}/{RAISED_CASE}", timeout=10)
    assert raised.headers["X-Chatgold-Outcome"] == "raised"
    assert raised.content == read_golden(TEMPLATE, RAISED_CASE).data
    as_json = requests.get(f"{server}/v1/goldens/{TEMPLATE}/{RAISED_CASE}",
                           headers={"Accept": "application/json"}, timeout=10).json()
    assert as_json["kind"] == "raised" and as_json["text"] == read_golden(TEMPLATE, RAISED_CASE).text


def test_check_statuses(server):
    golden = read_golden(TEMPLATE, RENDERED_CASE).text
    client = ServiceClient(server)
    assert client.check(TEMPLATE, RENDERED_CASE, output=golden)["status"] == "match"
    wrong = golden.replace("assistant\n", "assistant ")
    result = client.check(TEMPLATE, RENDERED_CASE, output=wrong)
    assert result["status"] == "diverged" and not result["passed"]
    assert result["divergence"]["offset"] == golden.index("assistant\n") + len("assistant")
    assert "⟦" in result["divergence"]["expected_context"] and "⟦" in result["divergence"]["actual_context"]
    attribution = result["attribution"]
    assert attribution["line"] == 1 or "unavailable" in attribution, attribution
    assert client.check(TEMPLATE, RENDERED_CASE, raised="nope")["status"] == "engine-raised"
    # The reference's refusal here is a render-time TypeError: only a render refusal matches it.
    both = client.check(TEMPLATE, RAISED_CASE, raised="I refuse", refusal="render")
    assert both["status"] == "both-raised" and both["passed"] and both["reference_refusal"] == "render"
    other = client.check(TEMPLATE, RAISED_CASE, raised="I refuse", refusal="compile")
    assert other["status"] == "raised-differently" and not other["passed"] and "kind render" in other["note"]
    unknown = client.check(TEMPLATE, RAISED_CASE, raised="I refuse")  # no kind: nothing vouches for it
    assert unknown["status"] == "raised-differently"
    rendered = client.check(TEMPLATE, RAISED_CASE, output="something")
    assert rendered["status"] == "engine-rendered"
    assert rendered["reference_message"] == read_golden(TEMPLATE, RAISED_CASE).text


def test_check_batch(server):
    golden = read_golden(TEMPLATE, RENDERED_CASE).text
    cells = [{"template": TEMPLATE, "case": RENDERED_CASE, "output": golden},
             {"template": TEMPLATE, "case": RENDERED_CASE, "output": golden + "x"},
             {"template": TEMPLATE, "case": RAISED_CASE, "raised": "no", "refusal": "render"}]
    body = requests.post(f"{server}/v1/check/batch", json={"cells": cells}, timeout=30).json()
    assert [r["status"] for r in body["results"]] == ["match", "diverged", "both-raised"]
    assert body["summary"]["passed"] == 2 and body["summary"]["cells"] == 3 and body["summary"]["judged"] == 3
    too_many = requests.post(f"{server}/v1/check/batch", json={"cells": cells[:1] * (MAX_BATCH_CELLS + 1)}, timeout=30)
    assert too_many.status_code == 422
    bad_cell = requests.post(f"{server}/v1/check/batch", json={"cells": [cells[0], {**cells[0], "case": "nope"}]},
                             timeout=30)
    assert bad_cell.status_code == 404 and "cells[1]" in bad_cell.json()["detail"]


@pytest.mark.parametrize("path, allowed", [
    ("/v1/templates/no-such-template", {404}),
    ("/v1/cases/no-such-case", {404}),
    (f"/v1/goldens/{TEMPLATE}/no-such-case", {404}),
    (f"/v1/goldens/no-such-template/{RENDERED_CASE}", {404}),
    ("/v1/templates/Bad%20Id", {400}),
    ("/v1/goldens/..%2F..%2Fetc/passwd", {400, 404}),
    (f"/v1/goldens/%2e%2e/{RENDERED_CASE}", {400, 404}),
    (f"/v1/goldens/{TEMPLATE}/..%2F..%2Fmanifest", {400, 404}),
    (f"/v1/goldens/{TEMPLATE}/%2e%2e", {400, 404}),
])
def test_bad_ids_are_refused(server, path, allowed):
    response = requests.get(server + path, timeout=10)
    assert response.status_code in allowed, (path, response.status_code, response.text)
    assert response.json()["detail"]


def test_bad_bodies_are_refused(server):
    check = f"{server}/v1/check"
    malformed = requests.post(check, data=b"{not json", headers={"content-type": "application/json"}, timeout=10)
    assert malformed.status_code == 422 and "json" in malformed.text.lower()
    both = requests.post(check, json={"template": TEMPLATE, "case": RENDERED_CASE, "output": "a", "raised": "b"}, timeout=10)
    assert both.status_code == 422 and "exactly one" in both.text
    unknown = requests.post(check, json={"template": "nope", "case": RENDERED_CASE, "output": "a"}, timeout=10)
    assert unknown.status_code == 404 and "unknown template id" in unknown.json()["detail"]
    huge = requests.post(check, data=b"x" * (MAX_BODY_BYTES + 1), headers={"content-type": "application/json"}, timeout=30)
    assert huge.status_code == 413 and str(MAX_BODY_BYTES) in huge.json()["detail"]

    def streamed():  # no Content-Length: the limit is enforced while reading
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536
    chunked = requests.post(check, data=streamed(), headers={"content-type": "application/json"}, timeout=30)
    assert chunked.status_code == 413
    bad_sha = requests.post(f"{server}/v1/identify", json={"sha256": "XYZ"}, timeout=10)
    assert bad_sha.status_code == 422


def test_identify(server, corpus):
    entry = corpus.get(TEMPLATE)
    client = ServiceClient(server)
    by_text = client.identify(template=entry.source())
    assert by_text["matched"] and by_text["template"]["id"] == TEMPLATE
    assert client.identify(sha256=entry.sha256)["template"]["id"] == TEMPLATE
    unknown = client.identify(template=entry.source() + " ")
    assert not unknown["matched"] and "chatgold corpus import" in unknown["hint"]


def test_new_goldens_come_from_the_reference(server, corpus):
    entry = corpus.get(TEMPLATE)
    client = ServiceClient(server)
    made = client.new_goldens(entry.source(), entry.bos_token, entry.eos_token, cases=[RENDERED_CASE, RAISED_CASE])
    assert made["complete"] and made["corpus_id"] == TEMPLATE
    assert made["reference"].get("transformers") == "5.24.0"
    by_case = {g["case"]: g for g in made["goldens"]}
    for case_id in (RENDERED_CASE, RAISED_CASE):
        golden = read_golden(TEMPLATE, case_id)
        assert (by_case[case_id]["kind"], by_case[case_id]["text"]) == (golden.kind, golden.text)
    fresh = client.new_goldens("{{ bos_token }}[{{ messages[0].content }}]", "<s>", None, cases=[RENDERED_CASE])
    assert fresh["corpus_id"] is None
    assert fresh["goldens"][0]["text"] == "<s>[Hello! What is the capital of France?]"
    # Characters under the field limit but bytes over the template limit: a 413 naming both sizes.
    too_big = requests.post(f"{server}/v1/goldens", json={"template": "é" * (MAX_TEMPLATE_BYTES // 2 + 1)}, timeout=30)
    assert too_big.status_code == 413 and str(MAX_TEMPLATE_BYTES) in too_big.json()["detail"]
    with pytest.raises(ServiceError) as caught:
        client.new_goldens("x", cases=["no-such-case*"])
    assert caught.value.status == 400


def test_a_hanging_template_is_cut_off_and_the_service_keeps_working(server):
    hang = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}done"
    started = time.monotonic()
    made = ServiceClient(server).new_goldens(hang, cases=[RENDERED_CASE])
    assert time.monotonic() - started < 60
    assert not made["complete"] and made["goldens"][0]["kind"] == "errored"
    again = ServiceClient(server).new_goldens("ok", cases=[RENDERED_CASE])
    assert again["complete"] and again["goldens"][0] == {"case": RENDERED_CASE, "kind": "rendered", "text": "ok"}


def test_client_read_methods(server):
    client = ServiceClient(server)
    kind, data = client.golden(TEMPLATE, RENDERED_CASE)
    assert (kind, data) == ("rendered", read_golden(TEMPLATE, RENDERED_CASE).data)
    assert [t["id"] for t in client.templates([TEMPLATE])] == [TEMPLATE]
    assert client.case(RENDERED_CASE)["id"] == RENDERED_CASE
    with pytest.raises(ServiceError) as caught:
        client.template("no-such-template")
    assert caught.value.status == 404 and "unknown template id" in caught.value.message


def _chatgold(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=repo_root(), capture_output=True,
                          text=True, timeout=timeout)


def test_remote_check_with_the_reference_passes(server):
    done = _chatgold("remote-check", "--service", server, "--runner", "hf", "--template", TEMPLATE,
                     "--case", RENDERED_CASE, "--case", RAISED_CASE, "--case", "chat-system")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100.00% of 3 cells match" in done.stdout


def test_remote_check_reports_divergences(server):
    # The hand-written ChatML example ignores the template: on a Llama 3 template its output diverges.
    llama = "allenai-llama-3.1-tulu-3-8b-sft"
    assert read_golden(llama, RENDERED_CASE).text.startswith("<|")  # a golden exists to diverge from
    done = _chatgold("remote-check", "--service", server, "--runner", "chatml-builtin", "--template", llama,
                     "--case", RENDERED_CASE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{llama}/{RENDERED_CASE}: diverged at byte " in done.stdout
    assert "0.00% of 1 cells match" in done.stdout


def test_schemathesis_finds_no_server_errors(server):
    # Bounded property-based fuzzing from the OpenAPI document, loopback only. /v1/compat is left out: one
    # request renders every case through up to 8 engines (minutes); test_service_compat.py tests its bounds.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
         "run", f"{server}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "3",
         "--exclude-path", "/v1/compat",
         "--phases", "coverage,fuzzing", "--generation-deterministic", "--request-timeout", "60"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "passed" in done.stdout


def test_check_through_the_service_judges_like_the_local_goldens(server, tmp_path):
    # `chatgold check --service`: same local rendering, cells judged remotely; the report must agree with
    # a local check of the same selection, status for status and byte for byte.
    import json

    llama = "allenai-llama-3.1-tulu-3-8b-sft"
    selection = ["--runner", "chatml-builtin", "--template", llama, "--template", TEMPLATE,
                 "--case", RENDERED_CASE, "--case", RAISED_CASE, "--no-attribution"]
    env_dir = str(tmp_path / "no-expectations")
    reports = {}
    for label, extra in (("remote", ["--service", server]), ("local", [])):
        done = subprocess.run([sys.executable, "-m", "conformance.cli", "check", *selection, *extra,
                               "--json", str(tmp_path / f"{label}.json")], cwd=repo_root(), capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, CHATGOLD_EXPECTATIONS_DIR=env_dir))
        assert done.returncode == 1, done.stdout + done.stderr  # nothing is expected: the divergence is new
        reports[label] = load_report(tmp_path / f"{label}.json")
    remote, local = (reports[k]["runners"]["chatml-builtin"] for k in ("remote", "local"))
    assert remote["counts"] == local["counts"] and remote["counts"]["diverged"] >= 1
    strip = lambda cells: sorted((c["template"], c["case"], c["status"], c.get("fingerprint"),
                                  json.dumps(c.get("divergence"), sort_keys=True)) for c in cells)
    assert strip(reports["remote"].cells) == strip(reports["local"].cells)
    assert remote["passed"] == local["passed"]


def test_check_through_an_unreachable_service_fails_clearly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "conformance.cli", "check", "--service", "http://127.0.0.1:9",
                           "--runner", "hf", "--template", TEMPLATE, "--case", RENDERED_CASE], cwd=repo_root(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "cannot reach the service" in done.stderr
