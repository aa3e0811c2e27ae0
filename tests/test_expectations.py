"""Expected-divergence baselines: verdicts, compact file format, selective updates, bad files."""
from __future__ import annotations

import json

import pytest

from conformance.judge.expectations import (Expectation, ExpectationsError, describe_cell, load_expectations,
                                            update_expectations, verdict)
from conformance.judge.status import CellResult, Verdict

CHANGED, EXPECTED_FAIL, EXPECTED_PASS = Verdict.CHANGED, Verdict.EXPECTED_FAIL, Verdict.EXPECTED_PASS
UNEXPECTED_FAIL, UNEXPECTED_PASS, NOT_RUN = Verdict.UNEXPECTED_FAIL, Verdict.UNEXPECTED_PASS, Verdict.NOT_RUN


def _result(template, case, status, fingerprint=None, message=""):
    result = CellResult("engine-x", template, case, status, message=message)
    result.extra["fingerprint"] = fingerprint
    return result


@pytest.mark.parametrize("status, fp, expectation, expected", [
    ("match", None, None, EXPECTED_PASS),
    ("both-raised", None, Expectation("engine-raised", "aa"), UNEXPECTED_PASS),
    ("diverged", "aa", None, UNEXPECTED_FAIL),
    ("diverged", "aa", Expectation("diverged", "aa"), EXPECTED_FAIL),
    ("diverged", "bb", Expectation("diverged", "aa"), CHANGED),
    ("engine-raised", "aa", Expectation("diverged", "aa"), CHANGED),
    ("timeout", None, Expectation("timeout", None), EXPECTED_FAIL),
    ("skipped", None, None, NOT_RUN),
    ("skipped", None, Expectation("skipped", None), NOT_RUN),
    ("raised-differently", "aa", None, UNEXPECTED_FAIL),
])
def test_verdicts(status, fp, expectation, expected):
    assert verdict(_result("t", "c", status, fp), expectation) == expected


def test_update_writes_compact_grouped_file_and_selection_keeps_the_rest(tmp_path):
    results = [_result("t1", "a", "diverged", "0123456789abcdef"), _result("t1", "b", "match"),
               _result("t2", "a", "engine-raised", "fedcba9876543210", "no documents"),
               _result("t2", "b", "skipped", None, "no documents")]  # not run: never in a baseline
    _, counts = update_expectations("engine-x", results, directory=tmp_path)
    assert counts == {"added": 2, "removed": 0, "changed": 0, "total": 2}
    text = (tmp_path / "engine-x.json").read_text()
    data = json.loads(text)
    assert data["cells"] == {"t1": {"a": "diverged:0123456789abcdef"}, "t2": {"a": "engine-raised:fedcba9876543210"}}
    assert '"t1": {"a":"diverged:0123456789abcdef"}' in text  # one template per line
    # Give t1 a hand-written reason; a selective update of t2 only must keep t1 and the rule.
    data["rules"].insert(0, {"template": "t1", "reason": "minijinja escapes apostrophes", "link": "issue-1"})
    (tmp_path / "engine-x.json").write_text(json.dumps(data))
    _, counts = update_expectations("engine-x", [_result("t2", "a", "match")], selected={("t2", "a")},
                                    directory=tmp_path)
    assert counts["removed"] == 1 and counts["total"] == 1
    loaded = load_expectations("engine-x", tmp_path)
    assert loaded.cells == {"t1": {"a": "diverged:0123456789abcdef"}}
    expectation = loaded.get("t1", "a")
    assert (expectation.reason, expectation.link, expectation.fingerprint) == (
        "minijinja escapes apostrophes", "issue-1", "0123456789abcdef")
    changed = _result("t1", "a", "diverged", "1111111111111111")
    changed.expectation, changed.verdict = expectation, CHANGED
    message = describe_cell(changed)
    assert "the output changed" in message and "minijinja escapes apostrophes" in message


def test_bad_files_name_the_file_and_the_problem(tmp_path):
    path = tmp_path / "engine-x.json"
    path.write_text("{not json")
    with pytest.raises(ExpectationsError, match="engine-x.json: not readable JSON"):
        load_expectations("engine-x", tmp_path)
    path.write_text(json.dumps({"format": 1, "rules": [], "cells": {"t": {"c": "match"}}}))
    with pytest.raises(ExpectationsError, match=r"engine-x.json: cells\['t'\]\['c'\] = 'match': status must be"):
        load_expectations("engine-x", tmp_path)


def test_reference_and_evaluator_cannot_have_expectations(tmp_path):
    (tmp_path / "hf.json").write_text("{}")
    with pytest.raises(ExpectationsError, match="hf must match every golden"):
        load_expectations("hf", tmp_path)
    with pytest.raises(ExpectationsError, match="evaluator must match every golden"):
        update_expectations("evaluator", [], directory=tmp_path)


def test_a_template_failing_every_case_is_stored_as_a_default(tmp_path):
    from conformance.corpus.cases import load_cases

    case_ids = [c.id for c in load_cases()]
    results = [_result("t3", c, "engine-raised", "aaaaaaaaaaaaaaaa", "no support") for c in case_ids[1:]]
    results.append(_result("t3", case_ids[0], "engine-raised", "bbbbbbbbbbbbbbbb"))
    results.append(_result("t4", case_ids[0], "diverged", "cccccccccccccccc"))  # not every case: no default
    update_expectations("engine-x", results, directory=tmp_path)
    data = json.loads((tmp_path / "engine-x.json").read_text())
    assert data["cells"]["t3"] == {"*": "engine-raised:aaaaaaaaaaaaaaaa", case_ids[0]: "engine-raised:bbbbbbbbbbbbbbbb"}
    assert data["cells"]["t4"] == {case_ids[0]: "diverged:cccccccccccccccc"}
    loaded = load_expectations("engine-x", tmp_path)
    assert loaded.get("t3", case_ids[5]).fingerprint == "aaaaaaaaaaaaaaaa"
    assert loaded.get("t3", case_ids[0]).status == "engine-raised"
    assert loaded.get("t4", case_ids[5]) is None
    # A selective update of one case now passing expands the default and keeps every other case.
    _, counts = update_expectations("engine-x", [_result("t3", case_ids[5], "match")],
                                    selected={("t3", case_ids[5])}, directory=tmp_path)
    assert counts["removed"] == 1 and counts["added"] == 0
    loaded = load_expectations("engine-x", tmp_path)
    assert loaded.get("t3", case_ids[5]) is None and loaded.get("t3", case_ids[6]).fingerprint == "aaaaaaaaaaaaaaaa"
