"""POST /v1/compat on the real service (`chatgold serve` on 127.0.0.1): the record `chatgold compat --format json`
writes, for the same template and engines, and the request's bounds."""
from __future__ import annotations

import json

import pytest
import requests
from service_support import start_service, stop_service

from conformance import schema_validator
from conformance.cli import main
from conformance.service.limits import COMPAT_MAX_ENGINES

# `content: null` printed: transformers drops null keys, MiniJinja prints its none (a known minijinja cause)
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def server():
    proc, url = start_service()
    yield url
    stop_service(proc)


def _comparable(record: dict) -> dict:
    """The record without what differs by how it was asked for: the file's name and the time taken."""
    record = json.loads(json.dumps(record))
    record.pop("file")
    for template in record["templates"]:
        template.pop("seconds")
        template["template"].pop("name")
    return record


def test_compat_answers_what_the_cli_writes(server, tmp_path, capsys):
    answer = requests.post(f"{server}/v1/compat", json={"template": CHATML, "bos_token": "<s>",
                                                        "engines": ["minijinja"]}, timeout=600)
    assert answer.status_code == 200, answer.text
    record = answer.json()
    schema_validator("compat.schema.json").validate(record)
    minijinja = record["templates"][0]["engines"][0]
    assert record["renders_right_everywhere"] is False and minijinja["counts"]["differs"] >= 1
    assert any(c["known"] and c["reason"] for c in minijinja["causes"])

    path = tmp_path / "chat_template.jinja"
    path.write_text(CHATML)
    code = main(["compat", str(path), "--engines", "minijinja", "--bos", "<s>", "--format", "json"])
    cli = json.loads(capsys.readouterr().out)
    assert code == 1
    assert _comparable(record) == _comparable(cli)


def test_compat_requests_are_bounded(server):
    post = lambda body: requests.post(f"{server}/v1/compat", json=body, timeout=60)
    # a program of the request's choosing never runs: only the suite's own engines
    refused = post({"template": "x", "engines": ["command:/bin/echo"]})
    assert refused.status_code == 400 and "unknown engine" in refused.json()["detail"]
    assert post({"template": "x", "engines": ["no-such-engine"]}).status_code == 400
    assert post({"template": "x", "engines": ["minijinja"] * (COMPAT_MAX_ENGINES + 1)}).status_code == 422
    assert post({"template": "x", "cases": ["no-such-case*"], "engines": ["minijinja"]}).status_code == 400
    assert post({"template": "x", "extra": 1}).status_code == 422
