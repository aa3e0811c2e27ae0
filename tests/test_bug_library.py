"""The bug library: plausible engine bugs planted one at a time, and three at a time, in an HF-faithful jinja2
harness (tests/harnesses/buggy_jinja2.py); `chatgold explain` must give back exactly the bugs planted.

For every bug alone: exactly one cause, holding exactly the cells that bug fails. For a combination of three:
exactly three causes, one per bug, each holding every cell only its bug fails and no cell its bug does not
fail (a cell two bugs fail is filed under one of them); every non-matching cell under a cause. The bug-free
harness: 100% and no cause. Six small corpus templates x every case; both protocol versions.
"""
from __future__ import annotations

import random
import shlex
import sys
from pathlib import Path

import pytest

from conformance.checkrun import check_cells as run
from conformance.explain import explain
from conformance.explain.minimal import is_one_minimal
from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
from conformance.judge.status import NON_MATCHING
from runners import get_runner

HARNESS = Path(__file__).parent / "harnesses" / "buggy_jinja2.py"
TEMPLATES = ["zai-org-glm-4-9b-0414", "tencent-penguin-vl-2b", "mistralai-mistral-small-24b-instruct-2501",
             "meta-llama-llama-3.1-8b-instruct", "ibm-granite-granite-3.0-8b-instruct", "qwen-qwen2.5-7b-instruct"]
# Every bug here shows in some cell of TEMPLATES (asserted); the harness has more that these templates never
# reach with the suite's cases.
BUGS = ["tojson-sorts-keys", "tojson-escapes-html", "tojson-ignores-indent", "no-trim-blocks", "no-lstrip-blocks",
        "no-raise-exception", "no-strftime-now", "null-keys-kept", "null-content-empty", "loop-last-early",
        "trim-keeps-newlines", "iterable-false-on-strings", "str-plus-list-allowed", "bos-doubled",
        "generation-prompt-ignored", "no-string-test", "eos-token-unbound", "tool-arguments-parsed",
        "developer-as-system", "empty-tools-as-none", "continue-rebuilt", "message-keys-dropped",
        "one-part-content-flattened", "text-parts-joined", "date-string-bound",
        "data-keys-sorted", "tool-calls-as-content", "final-assistant-continued"]
COMBINATIONS = [tuple(sorted(random.Random(seed).sample(BUGS, 3))) for seed in range(10)]
# Bugs a request layer makes by probing the template first (as llama.cpp's capability probe does), and corpus
# templates they show in: a template that prints no system message, or prints a one-part content list's text
# and not a string content. A probe template prints the data it is given, so these show only on the
# reproducer's own template.
PROBED = {"system-folded": ["google-gemma-2-2b-it", "microsoft-phi-3-medium-128k-instruct"],
          "content-parts-probed": ["huggingfacetb-smolvlm-256m-instruct", "minimaxai-minimax-text-01-hf"]}


def buggy(*bugs, protocol: int = 2):
    argv = [sys.executable, str(HARNESS), "--protocol", str(protocol)] + [a for bug in bugs for a in ("--bug", bug)]
    return get_runner("command:" + shlex.join(argv), workers=2, timeout=20)


@pytest.fixture(scope="module")
def cells():
    return Selection.load(TEMPLATES).cells()


@pytest.fixture(scope="module")
def reference():
    runner = get_runner("hf", workers=2)
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def alone(cells):
    """bug -> the cells it fails on its own (a check, no explanation)."""
    out = {}
    for bug in BUGS:
        with buggy(bug) as runner:
            results = run(runner, cells, GoldenJudge(), tokens=False)
        assert all(r.passed or r.status in NON_MATCHING for r in results.results), bug
        out[bug] = {r.key for r in results.results if r.status in NON_MATCHING}
        assert out[bug], f"{bug} shows in no cell: the library would prove nothing for it"
    return out


def _explained(bugs, cells, reference, protocol=2, minimal=False):
    with buggy(*bugs, protocol=protocol) as runner:
        results = run(runner, cells, GoldenJudge(), tokens=False)
        explanation = explain(results, runner, reference, requests_by_cell(cells))
        if minimal:   # every reproducer is 1-minimal: no registered single step keeps its difference
            for cause in explanation.causes:
                verdict = is_one_minimal(cause.repro(), runner, reference)
                assert verdict, f"{cause.title}: {verdict.reason or verdict.kept[0]}"
    failing = {r.key for r in results.results if r.status in NON_MATCHING}
    return results, failing, explanation


def _describe(explanation) -> str:
    return "; ".join(f"{c.id} ({len(c.cells)} cells): {c.title}" for c in explanation.causes)


@pytest.mark.parametrize("protocol", [2, 1])
def test_the_bug_free_harness_gets_100_percent_and_no_cause(cells, reference, protocol):
    results, failing, explanation = _explained((), cells, reference, protocol)
    assert results.figure()["conformance"] == 100.0
    assert explanation.causes == [] and explanation.unexplained == []


@pytest.mark.parametrize("protocol", [2, 1])
@pytest.mark.parametrize("bug", BUGS)
def test_each_bug_alone_is_one_cause_with_exactly_its_cells(bug, protocol, cells, reference, alone):
    results, failing, explanation = _explained((bug,), cells, reference, protocol, minimal=protocol == 2)
    if protocol == 2:
        assert failing == alone[bug]
    # (protocol 1 carries no refusal kind: which refusals match the reference's is the verdict's business, so
    # the cells are those this run fails)
    assert explanation.unexplained == []
    assert len(explanation.causes) == 1, _describe(explanation)
    [cause] = explanation.causes
    assert set(cause.cells) == failing
    assert cause.confirmed


@pytest.mark.parametrize("bug", sorted(PROBED))
def test_a_rewrite_decided_by_probing_the_template_is_one_cause(bug, reference):
    cells = Selection.load(PROBED[bug] + TEMPLATES[:2]).cells()
    results, failing, explanation = _explained((bug,), cells, reference, minimal=True)
    assert failing and {key[0] for key in failing} <= set(PROBED[bug]), "the bug shows where its probe fires"
    assert explanation.unexplained == []
    assert len(explanation.causes) == 1, _describe(explanation)
    [cause] = explanation.causes
    assert set(cause.cells) == failing and cause.confirmed


@pytest.mark.parametrize("bugs", COMBINATIONS, ids="+".join)
def test_three_bugs_are_three_causes(bugs, cells, reference, alone):
    results, failing, explanation = _explained(bugs, cells, reference)
    assert explanation.unexplained == []
    assert failing == {cell for cause in explanation.causes for cell in cause.cells}
    # A bug none of whose cells is its own (every one also fails through another planted bug, which shows first:
    # a doubled BOS before a bound `date_string`) may be found under the other's cause: a cell has one cause.
    separable = [bug for bug in bugs if _only(bug, bugs, alone)]
    assert len(separable) <= len(explanation.causes) <= len(bugs), _describe(explanation)
    matched = set()
    for cause in explanation.causes:
        cells_ = set(cause.cells)
        owners = [bug for bug in bugs if cells_ <= alone[bug] | _shared(bug, bugs, alone)
                  and _only(bug, bugs, alone) <= cells_]
        assert len(owners) == 1, f"{cause.title}: not one planted bug's cells ({owners})"
        matched.add(owners[0])
    assert set(separable) <= matched <= set(bugs)


def _only(bug, bugs, alone) -> set:
    """The cells this bug fails and none of the others does."""
    return alone[bug] - set().union(*(alone[other] for other in bugs if other != bug))


def _shared(bug, bugs, alone) -> set:
    return set().union(*(alone[other] & alone[bug] for other in bugs if other != bug))
