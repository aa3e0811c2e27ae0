"""`chatgold compat --fix`: each portable rewrite proven on a corpus template by rendering (the reference's
bytes unchanged on every case, at least one real engine renders more cases right), and the proof's rules."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import schema_validator
from conformance.analysis.rewrites import REWRITES, prove
from conformance.cli import main

ROOT = Path(__file__).resolve().parent.parent
BY_NAME = {r.name: r for r in REWRITES}


def _config(tmp_path, template_id: str) -> Path:
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get(template_id)
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": entry.source(), "bos_token": entry.bos_token,
                                "eos_token": entry.eos_token}))
    return path


def _digest(capsys, path: Path, engine: str) -> dict:
    main(["compat", str(path), "--engines", engine, "--workers", "1", "--format", "json"])
    return json.loads(capsys.readouterr().out)["templates"][0]


@pytest.mark.parametrize("rewrite, template_id, engine", [
    ("get-subscript", "moonshotai-kimi-k2.7-code", "mistralrs"),         # "too many arguments" for .get(k, d)
    ("tojson-ensure-ascii", "zai-org-glm-4-9b-0414", "minijinja"),      # unknown keyword argument 'ensure_ascii'
])
def test_each_rewrite_is_proven_on_a_corpus_template(tmp_path, capsys, rewrite, template_id, engine):
    path = _config(tmp_path, template_id)
    out = tmp_path / "fixed.jinja"
    main(["compat", str(path), "--engines", engine, "--workers", "1", "--fix", str(out), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    schema_validator("compat.schema.json").validate(data)
    applied = {entry["name"]: entry for entry in data["fix"]["applied"]}
    assert rewrite in applied and applied[rewrite]["gained"][engine] > 0
    assert any(cause.startswith(f"{engine}:") for cause in applied[rewrite]["causes"])
    assert data["fix"]["after"][engine] > data["fix"]["before"][engine]
    # proven again here, independently: the written template renders the reference's bytes on every case
    text = out.read_text()
    assert text != json.loads(path.read_text())["chat_template"]
    fixed = tmp_path / "tokenizer_config.fixed.json"
    fixed.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": text}))
    again = _digest(capsys, fixed, engine)
    assert again["reference"]["digest"] == data["templates"][0]["reference"]["digest"]
    assert again["engines"][0]["counts"]["right"] == data["fix"]["after"][engine]


def test_rewrites_touch_code_only_and_nest():
    get = BY_NAME["get-subscript"].apply
    text, sites = get("Say m.get('x') here. {{ m.get('a', m.get('b', '')) }}{% if m.get('c') %}y{% endif %}")
    assert sites == 3
    assert text == ("Say m.get('x') here. {{ (m['a'] if 'a' in m else (m['b'] if 'b' in m else '')) }}"
                    "{% if (m['c'] if 'c' in m else none) %}y{% endif %}")
    ascii_ = BY_NAME["tojson-ensure-ascii"].apply
    assert ascii_("{{ x|tojson(ensure_ascii=False) }}{{ y|tojson(indent=2, ensure_ascii=False) }}") == (
        "{{ x|tojson }}{{ y|tojson(indent=2) }}", 2)
    assert ascii_("{{ x|tojson(ensure_ascii=True) }}") == ("{{ x|tojson(ensure_ascii=True) }}", 0)


def _record(digest: str, **right) -> dict:
    return {"reference": {"digest": digest}, "engines": [{"engine": e, "counts": {"right": n}} for e, n in right.items()]}


def test_the_proof_refuses_a_changed_reference_a_loss_or_no_gain():
    base = _record("a" * 64, tgi=10, minijinja=50)
    assert prove(base, _record("a" * 64, tgi=20, minijinja=50))[0]
    assert prove(base, _record("b" * 64, tgi=20, minijinja=50)) == (False, {}, "the reference's bytes change on some case")
    assert not prove(base, _record("a" * 64, tgi=20, minijinja=49))[0]
    assert not prove(base, _record("a" * 64, tgi=10, minijinja=50))[0]


def test_fix_never_overwrites_its_input(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].get('content', '') }}")
    assert main(["compat", str(path), "--engines", "tgi", "--fix", str(path)]) == 2
    assert "will not overwrite" in capsys.readouterr().err
    assert path.read_text() == "{{ messages[0].get('content', '') }}"
