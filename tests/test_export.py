"""Test vectors: `chatgold export` writes self-contained JSON lines an engine in any language can run."""
from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys

import jsonschema

from conformance import repo_root, schema_validator
from conformance.corpus.cases import load_cases, select_cases
from conformance.corpus.manifest import load_corpus
from conformance.judge.goldens import read_golden, write_golden
from conformance.service.export import export_vectors, schema_path
from runners.base import Rendered, RenderRequest, refusal_of
from runners.semantics import reference_bindings

TEMPLATES = ["01-ai-yi-1.5-9b-chat", "allenai-llama-3.1-tulu-3-8b-sft"]
CASES = ["chat-single-user", "content-parts-image", "chat-system"]


def _validator():
    return schema_validator("vector.schema.json")


def _export(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["export", "--out", str(out), *extra] + [a for t in TEMPLATES for a in ("--template", t)] \
        + [a for c in CASES for a in ("--case", c)]
    done = subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=repo_root(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(json.loads(schema_path().read_text()))


def test_export_cli_writes_valid_self_contained_vectors(tmp_path, hf_renderer):
    out = _export(tmp_path, "vectors.jsonl")
    lines = out.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every record ends with a newline
    records = [json.loads(line) for line in lines[:-1]]
    validator = _validator()
    for record in records:
        validator.validate(record)
    header, cells = records[0], records[1:]
    assert header["record"] == "header" and header["cells"] == len(cells) == len(TEMPLATES) * len(CASES)
    assert header["reference"] == {"jinja2": "3.1.6", "tokenizers": "0.23.3", "transformers": "5.24.0"}
    assert header["format"] == 2 and header["bindings"] is False
    corpus = load_corpus()
    kinds = set()
    for cell in cells:
        entry = corpus.get(cell["template"]["id"])
        assert cell["template"]["source"] == entry.source()
        assert hashlib.sha256(cell["template"]["source"].encode()).hexdigest() == cell["template"]["sha256"]
        golden = read_golden(entry.id, cell["case"]["id"])
        expected = cell["expected"]
        assert (expected["kind"], expected["text"].encode()) == (golden.kind, golden.data)
        assert expected["sha256"] == hashlib.sha256(golden.data).hexdigest()
        if golden.raised:  # the refusal split as SEMANTICS.md R23 says: "<type>: <message>", kind by type
            refusal = expected["refusal"]
            assert f"{refusal['type']}: {refusal['message']}" == golden.text
            assert refusal["kind"] == str(refusal_of(refusal["type"]))
        kinds.add(expected["kind"])
        # The line alone is enough to reproduce the expectation with the reference (no case files, no corpus).
        case = cell["case"]
        outcome = hf_renderer.render(RenderRequest.make(
            template=cell["template"]["source"], messages=case["messages"], bos_token=cell["template"]["bos_token"],
            eos_token=cell["template"]["eos_token"], tools=case["tools"], documents=case["documents"],
            add_generation_prompt=case["add_generation_prompt"], continue_final_message=case["continue_final_message"],
            kwargs=case["kwargs"], now=case["now"]))
        assert outcome.kind == expected["kind"]
        if isinstance(outcome, Rendered):
            assert outcome.text == expected["text"]
    assert kinds == {"rendered", "raised"}


def test_missing_goldens_are_listed_not_invented(tmp_path):
    corpus = load_corpus()
    templates = [corpus.get(TEMPLATES[0])]
    cases = select_cases(load_cases(), CASES[:2])
    root = tmp_path / "goldens"
    write_golden(TEMPLATES[0], CASES[0], Rendered("only this one"), root)
    (root / "_meta.json").write_text(json.dumps({"transformers": "5.24.0"}))
    header = export_vectors(tmp_path / "v.jsonl", templates, cases, goldens_root=root)
    records = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert header["cells"] == 1 and header["missing_goldens"] == [f"{TEMPLATES[0]}/{CASES[1]}"]
    assert len(records) == 2 and records[1]["expected"]["text"] == "only this one"


def test_lone_surrogates_survive_as_escapes(tmp_path):
    corpus = load_corpus()
    root = tmp_path / "goldens"
    write_golden(TEMPLATES[0], CASES[0], Rendered("a\ud800b"), root)
    export_vectors(tmp_path / "v.jsonl", [corpus.get(TEMPLATES[0])], select_cases(load_cases(), CASES[:1]), root)
    line = (tmp_path / "v.jsonl").read_bytes().splitlines()[1]
    line.decode("utf-8")  # still valid UTF-8: the surrogate is a \\u escape
    assert json.loads(line)["expected"]["text"] == "a\ud800b"


def test_empty_selection_is_an_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "conformance.cli", "export", "--out", str(tmp_path / "v.jsonl"),
                           "--template", "no-such-*"], cwd=repo_root(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "selection is empty" in done.stderr
    assert not (tmp_path / "v.jsonl").exists()


def test_export_is_deterministic_and_gzip_is_the_same_bytes(tmp_path):
    """Two exports are byte-identical, compressed or not (a release publishes their sha256)."""
    first = _export(tmp_path, "a.jsonl.gz").read_bytes()
    second = _export(tmp_path, "b.jsonl.gz").read_bytes()
    assert first == second and first[:2] == b"\x1f\x8b"
    plain = _export(tmp_path, "c.jsonl").read_bytes()
    assert gzip.decompress(first) == plain == _export(tmp_path, "d.jsonl").read_bytes()
    assert (tmp_path / "c.jsonl").stat().st_mode & 0o044  # readable by others, as any exported file


def test_export_bindings_are_the_reference_bindings(tmp_path):
    out = _export(tmp_path, "v.jsonl", "--bindings")
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    validator = _validator()
    assert records[0]["bindings"] is True
    for record in records[1:]:
        validator.validate(record)
        case, template = record["case"], record["template"]
        request = RenderRequest.make(template["source"], case["messages"], bos_token=template["bos_token"],
                                     eos_token=template["eos_token"], tools=case["tools"],
                                     documents=case["documents"], add_generation_prompt=case["add_generation_prompt"],
                                     continue_final_message=case["continue_final_message"], kwargs=case["kwargs"])
        assert record["bindings"] == reference_bindings(request)
        assert "tools" in record["bindings"] and record["bindings"]["tools"] is None  # R7: bound to none
