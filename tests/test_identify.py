"""`chatgold identify`: real GGUF files (written with gguf.GGUFWriter), header-only reading, corpus matching."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from conformance import repo_root
from conformance.analysis.identify import identify_gguf, runner_results
from conformance.corpus.manifest import load_corpus

KNOWN = "01-ai-yi-1.5-9b-chat"
TOKENS = ["<unk>", "<|startoftext|>", "<|im_end|>", "hello"]


def write_gguf(path: Path, default: str | None, named: dict | None = None) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if default is not None:
        writer.add_chat_template(default)
    for name, text in (named or {}).items():
        writer.add_string(f"tokenizer.chat_template.{name}", text)
    if named:
        writer.add_array("tokenizer.chat_templates", list(named))
    writer.add_tensor("weights", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _identify(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo_root()), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "conformance.cli", "identify", *args], cwd=cwd or repo_root(),
                          capture_output=True, text=True, timeout=120, env=env)


def test_known_and_unknown_templates_in_one_file(tmp_path):
    known = load_corpus().get(KNOWN)
    path = write_gguf(tmp_path / "model.gguf", known.source(), {"tool_use": "{{ messages }}-not-in-corpus"})
    findings = {f.name: f for f in identify_gguf(path, load_corpus())}
    assert findings["default"].corpus_id == KNOWN and findings["default"].family == known.family
    assert findings["default"].sha256 == known.sha256
    assert (findings["default"].bos_token, findings["default"].eos_token) == ("<|startoftext|>", "<|im_end|>")
    assert findings["tool_use"].corpus_id is None
    assert findings["tool_use"].key == "tokenizer.chat_template.tool_use"

    done = _identify(str(path), cwd=tmp_path)  # no reports/report.json here: tolerated
    assert done.returncode == 0, done.stderr
    assert f"corpus: {KNOWN}  family: {known.family}" in done.stdout
    assert "unknown: not in the corpus" in done.stdout and f"chatgold corpus import {path}" in done.stdout
    assert "no runner results" in done.stdout


def _report(runners: dict, cells: list):
    from conformance.report import REPORT_FORMAT, Report

    return Report({"format": REPORT_FORMAT, "runners": runners, "cell_records": len(cells)}, cells)


def test_runner_results_come_from_the_report(tmp_path):
    from conformance.report import write_json

    path = write_gguf(tmp_path / "model.gguf", load_corpus().get(KNOWN).source())
    # The shape `chatgold check --json` writes: expected passes by template in the JSON, every other cell a
    # record in the sidecar; a skipped cell is outside the conformance denominator.
    report = _report({"minijinja": {"passed": {KNOWN: ["a"]}}, "hfjs": {"passed": {"other": ["a"]}}},
                     [{"runner": "minijinja", "template": KNOWN, "case": "b", "status": "diverged"},
                      {"runner": "minijinja", "template": KNOWN, "case": "c", "status": "skipped"},
                      {"runner": "hfjs", "template": KNOWN, "case": "a", "status": "both-raised"}])
    write_json(report, tmp_path / "report.json")
    assert runner_results(report)[KNOWN]["minijinja"] == {"cells": 3, "judged": 2, "passed": 1, "conformance": 50.0}
    done = _identify(str(path), "--report", str(tmp_path / "report.json"), "--json")
    assert done.returncode == 0, done.stderr
    (finding,) = json.loads(done.stdout)["templates"]
    assert finding["runners"] == {"minijinja": {"cells": 3, "judged": 2, "passed": 1, "conformance": 50.0},
                                  "hfjs": {"cells": 1, "judged": 1, "passed": 1, "conformance": 100.0}}
    text = _identify(str(path), "--report", str(tmp_path / "report.json")).stdout
    assert "minijinja: 1/3 cells pass of 2 run (50.0%)" in text


def test_no_template_and_bad_files_are_reported(tmp_path):
    bare = write_gguf(tmp_path / "bare.gguf", None)
    done = _identify(str(bare), cwd=tmp_path)
    assert done.returncode == 0 and "no chat template in the header" in done.stdout
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + b"\0" * 64)
    done = _identify(str(junk))
    assert done.returncode == 2 and str(junk) in done.stderr
    done = _identify(str(bare), "--report", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "missing.json: report file not found" in done.stderr


def test_real_vocab_ggufs_of_llama_cpp(llamacpp_models):
    """llama.cpp ships vocab-only GGUFs (cached by scripts/setup.sh; tests never download)."""
    models = sorted(llamacpp_models.glob("ggml-vocab-*.gguf"))
    assert models, f"no vocab GGUF under {llamacpp_models}"
    corpus = load_corpus()
    matched = 0
    for model in models:
        for finding in identify_gguf(model, corpus):
            assert len(finding.sha256) == 64
            if finding.corpus_id is not None:
                matched += 1
                assert corpus.get(finding.corpus_id).sha256 == finding.sha256
    # The corpus imports llama.cpp's vocab GGUFs, so the templates they embed are known to it.
    assert matched, [m.name for m in models]


def test_runner_results_count_every_cell_of_a_gate_report():
    from conformance.analysis.identify import runner_results

    report = _report({"minijinja": {"passed": {"t": ["b", "c"]}}},
                     [{"runner": "minijinja", "template": "t", "case": c, "status": s}
                      for c, s in (("a", "diverged"), ("d", "diverged"), ("e", "engine-raised"))])
    assert runner_results(report) == {"t": {"minijinja": {"cells": 5, "judged": 5, "passed": 2, "conformance": 40.0}}}

def test_builtin_format_and_bos_answer_from_the_report(tmp_path):
    from conformance.report import write_json

    known = load_corpus().get(KNOWN)
    path = write_gguf(tmp_path / "model.gguf", known.source())  # SPM vocab without add-bos key: llama.cpp adds
    tokens = {"counts": {}, "templates": {}, "examples": [],
              "bos_by_template": {KNOWN: {"match": 1, "duplicated-bos": 2}},
              "flags": {KNOWN: {"add_bos_token": True, "add_eos_token": False}}}
    report = _report({"llamacpp-builtin": {"passed": {}, "basic": {"templates": {KNOWN: "wrong"}}, "tokens": tokens},
                      "llamacpp": {"passed": {}, "tokens": dict(tokens, flags={KNOWN: {"add_bos_token": False,
                                                                                      "add_eos_token": False}})}},
                     [])
    write_json(report, tmp_path / "report.json")
    text = _identify(str(path), "--report", str(tmp_path / "report.json")).stdout
    assert "llama.cpp without --jinja: built-in format chatml (contains '<|im_start|>')" in text
    assert "renders the basic conversations differently from the reference, without an error" in text
    assert "add_bos_token=true add_eos_token=false (add_bos_token llama.cpp's default for 'llama'/None" in text
    assert "BOS llamacpp-builtin: duplicated-bos in 2 of 3 cells (report)" in text
    # the report judged llamacpp with add_bos_token false: not this file's flags
    assert "BOS llamacpp: the report judged add_bos_token=False, this file has True: use --probe" in text
    unknown = write_gguf(tmp_path / "plain.gguf", "{% for m in messages %}{{ m.content }}{% endfor %}")
    text = _identify(str(unknown)).stdout
    assert "llama.cpp without --jinja: refuses this template" in text
