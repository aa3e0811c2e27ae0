"""Goldens: the store's rules, and the reference runner reproducing committed goldens into a fresh folder."""
from __future__ import annotations

import pytest

from conformance.corpus.cases import load_cases
from conformance.corpus.manifest import load_corpus
from conformance.judge.goldens import (
    cell_paths,
    find_orphans,
    goldens_dir,
    read_golden,
    update_goldens,
    write_golden,
)
from runners import get_runner
from runners.base import Raised, Rendered


def test_write_switches_variant_and_reports_change(tmp_path):
    assert write_golden("t", "c", Rendered("a\r\nb"), tmp_path)
    assert not write_golden("t", "c", Rendered("a\r\nb"), tmp_path)
    assert read_golden("t", "c", tmp_path).data == b"a\r\nb"
    assert write_golden("t", "c", Raised("TemplateError: no"), tmp_path)
    rendered, raised = cell_paths("t", "c", tmp_path)
    assert not rendered.exists() and raised.read_bytes() == b"TemplateError: no"
    assert read_golden("t", "c", tmp_path).raised


def test_orphans_unknown_template_case_stray_and_double_variant(tmp_path):
    write_golden("t", "c", Rendered("x"), tmp_path)
    write_golden("gone", "c", Rendered("x"), tmp_path)
    write_golden("t", "old-case", Rendered("x"), tmp_path)
    (tmp_path / "t" / ".c.txt.abc.tmp").write_bytes(b"half")
    (tmp_path / "t" / "c.raised.txt").write_bytes(b"stale")
    names = sorted(p.name for p in find_orphans(["t"], ["c"], tmp_path))
    assert names == [".c.txt.abc.tmp", "c.raised.txt", "gone", "old-case.txt"]


def test_committed_goldens_have_no_orphans():
    corpus = load_corpus()
    assert find_orphans([e.id for e in corpus.entries], [c.id for c in load_cases()]) == []


@pytest.mark.parametrize("pattern", ["qwen-qwen3-0.6b", "meta-llama-llama-3.1-8b-instruct", "google-gemma-2-2b-it"])
def test_reference_reproduces_committed_goldens(tmp_path, pattern):
    corpus = load_corpus()
    templates = corpus.select([pattern])
    assert templates, pattern
    cases = load_cases()
    with get_runner("hf") as runner:
        report = update_goldens(templates, cases, runner, root=tmp_path, prune=False)
    assert report.ok and report.cells == len(cases)
    for case in cases:
        fresh = read_golden(templates[0].id, case.id, tmp_path)
        committed = read_golden(templates[0].id, case.id, goldens_dir())
        assert fresh == committed, case.id
    # gemma-2 refuses a system role: the refusal is a golden too.
    if pattern == "google-gemma-2-2b-it":
        assert read_golden(templates[0].id, "chat-system").raised


def test_the_first_difference_and_a_golden_matching_text_agree_with_bytes_compared_one_by_one():
    """The judge's shortcuts (slices halved, text compared as text) give what byte-by-byte comparison gives:
    lengths around the block size, a difference anywhere, prefixes, lone surrogates, bytes that are no UTF-8."""
    import random

    from conformance.files import ENCODING_ERRORS
    from conformance.judge.diff import first_difference
    from conformance.judge.goldens import Golden

    def naive(expected: bytes, actual: bytes):
        if expected == actual:
            return None
        for index, (a, b) in enumerate(zip(expected, actual)):
            if a != b:
                return index
        return min(len(expected), len(actual))

    rng = random.Random(5)
    for _ in range(3000):
        base = bytes(rng.choice(b"ab\n\xc3\xa9") for _ in range(rng.choice((0, 1, 7, 4095, 4096, 4097, 9000))))
        other = bytearray(base)
        roll = rng.random()
        if roll < 0.4 and other:
            other[rng.randrange(len(other))] ^= 1
        elif roll < 0.6:
            other = other[:rng.randint(0, len(other))]
        elif roll < 0.8:
            other += b"x" * rng.randint(1, 3)
        assert first_difference(base, bytes(other)) == naive(base, bytes(other))
    texts = ["", "plain", "caf\u00e9 \U0001F600", "\ud83d\ude00 lone pair", "\udcc3\udc83", "\u00c3\u0083"]
    for golden_text in texts:
        golden = Golden("rendered", golden_text.encode("utf-8", ENCODING_ERRORS))
        for text in texts:
            assert golden.matches_text(text) == (text.encode("utf-8", ENCODING_ERRORS) == golden.data)
    undecodable = Golden("rendered", b"\xff\xfe text")
    assert not undecodable.matches_text("\ufffd\ufffd text")
