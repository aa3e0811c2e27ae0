"""Expected-divergence baselines: verdicts, compact file format, selective updates, bad files."""
from __future__ import annotations

import json

import pytest

from conformance.judge.expectations import (
    Expectation,
    ExpectationsError,
    describe_cell,
    load_expectations,
    update_expectations,
    verdict,
)
from conformance.judge.status import CellResult, Verdict

CHANGED, EXPECTED_FAIL, EXPECTED_PASS = Verdict.CHANGED, Verdict.EXPECTED_FAIL, Verdict.EXPECTED_PASS
UNEXPECTED_FAIL, UNEXPECTED_PASS, NOT_RUN = Verdict.UNEXPECTED_FAIL, Verdict.UNEXPECTED_PASS, Verdict.NOT_RUN


def _result(template, case, status, fingerprint=None, message=""):
    result = CellResult("engine-x", template, case, status, message=message)
    result.fingerprint = fingerprint
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
    assert counts == {"added": 2, "removed": 0, "changed": 0, "total": 2, "causes": 0, "causes_without_reason": 0,
                      "reasons_by_id": 0, "reasons_by_cells": 0, "reasons_merged": [], "reasons_dropped": []}
    text = (tmp_path / "engine-x.json").read_text()
    data = json.loads(text)
    assert data["cells"] == {"t1": {"a": "diverged:0123456789abcdef"}, "t2": {"a": "engine-raised:fedcba9876543210"}}
    assert '"t1": {"a":"diverged:0123456789abcdef"}' in text  # one template per line
    # Give t1 a hand-written reason; a selective update of t2 only must keep t1 and the rule.
    data.setdefault("rules", []).insert(0, {"template": "t1", "reason": "minijinja escapes apostrophes",
                                            "link": "issue-1"})
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


def _repro(status="diverged"):
    return {"template": "{{ x|tojson }}", "case": {"messages": [{"role": "user", "content": "it's"}]},
            "bos_token": None, "eos_token": None}


def test_format_2_records_causes_once_and_cells_by_cause(tmp_path):
    from conformance import schema_validator

    first = _result("t1", "a", "diverged", "0123456789abcdef")
    first.cause = "c-0123456789"
    second = _result("t2", "b", "engine-raised", "fedcba9876543210", "no tojson")
    unexplained = _result("t2", "c", "diverged", "1111111111111111")
    cause = {"id": "c-0123456789", "title": "`|tojson`: prints `\\u0027`", "constructs": ["filter:tojson"],
             "symptom": {"status": "diverged", "edits": [["'", "\\a0"]]}, "repro": _repro()}
    _, counts = update_expectations("engine-x", [first, second, unexplained], directory=tmp_path,
                                    causes={cause["id"]: cause})
    assert counts["causes"] == 1 and counts["causes_without_reason"] == 1
    data = json.loads((tmp_path / "engine-x.json").read_text())
    schema_validator("expectations.schema.json").validate(data)
    assert data["format"] == 2 and [c["id"] for c in data["causes"]] == ["c-0123456789"]
    assert data["cells"]["t1"] == {"a": "diverged:0123456789abcdef@c-0123456789"}
    assert data["status_reasons"]["diverged"].startswith("not reduced to a root cause")
    # A reason written by hand is carried forward by cause id when the baseline is recorded again.
    data["causes"][0]["reason"] = "minijinja's tojson escapes ' for HTML"
    data["causes"][0]["link"] = "https://example.invalid/issue/1"
    (tmp_path / "engine-x.json").write_text(json.dumps(data))
    again = _result("t3", "a", "diverged", "2222222222222222")
    again.cause = "c-0123456789"
    new, _ = update_expectations("engine-x", [first, again], directory=tmp_path,
                                 causes={cause["id"]: dict(cause, title="retitled")})
    known = new.causes["c-0123456789"]
    assert (known.reason, known.link, known.title) == ("minijinja's tojson escapes ' for HTML",
                                                       "https://example.invalid/issue/1", "retitled")
    loaded = load_expectations("engine-x", tmp_path)
    expectation = loaded.get("t3", "a")
    assert expectation.cause == "c-0123456789" and expectation.reason.startswith("minijinja's tojson")


def test_a_new_cell_with_a_known_cause_is_known(tmp_path):
    from conformance.judge.pipeline import apply_expectations

    (tmp_path / "engine-x.json").write_text(json.dumps({
        "format": 2, "runner": "engine-x",
        "causes": [{"id": "c-0123456789", "title": "t", "reason": "known bug", "repro": _repro()}],
        "cells": {"t1": {"a": "diverged:0123456789abcdef@c-0123456789"}}}))
    baseline = load_expectations("engine-x", tmp_path)
    known_cell = _result("t1", "a", "diverged", "0123456789abcdef")
    new_cell_known_cause = _result("t9", "z", "diverged", "3333333333333333")
    new_cell_known_cause.cause = "c-0123456789"
    changed_known_cause = _result("t1", "a", "diverged", "4444444444444444")
    changed_known_cause.cause = "c-0123456789"
    new_cause = _result("t9", "y", "diverged", "5555555555555555")
    new_cause.cause = "c-9999999999"
    results = [known_cell, new_cell_known_cause, changed_known_cause, new_cause]
    apply_expectations(results, baseline)
    assert [r.verdict for r in results] == [EXPECTED_FAIL, EXPECTED_FAIL, EXPECTED_FAIL, UNEXPECTED_FAIL]
    assert new_cell_known_cause.expectation.reason == "known bug"
    assert "root cause c-9999999999 (new)" in describe_cell(new_cause)


def test_a_cell_naming_an_unknown_cause_is_a_bad_file(tmp_path):
    (tmp_path / "engine-x.json").write_text(json.dumps({
        "format": 2, "causes": [], "cells": {"t": {"c": "diverged:0123456789abcdef@c-0123456789"}}}))
    with pytest.raises(ExpectationsError, match="cause c-0123456789 is not among the file's causes"):
        load_expectations("engine-x", tmp_path)


def _cause(cause_id):
    return {"id": cause_id, "title": "t", "constructs": [], "symptom": {"status": "diverged", "edits": [["'", ""]]},
            "repro": _repro()}


def test_reasons_are_carried_over_by_mechanism_when_causes_merge_or_split(tmp_path):
    """A re-record by mechanism gives new ids: each old reason goes to the new cause holding most of its cells;
    several reasons in one new cause are all kept (deduplicated) and the joined reason says so."""
    (tmp_path / "engine-x.json").write_text(json.dumps({
        "format": 2, "runner": "engine-x",
        "causes": [{"id": "c-000000000a", "title": "a", "reason": "tojson escapes ' for HTML",
                    "link": "https://example.invalid/1", "repro": _repro()},
                   {"id": "c-000000000b", "title": "b", "reason": "tojson escapes < for HTML",
                    "link": "https://example.invalid/2", "repro": _repro()},
                   {"id": "c-000000000c", "title": "c", "reason": "tojson escapes ' for HTML", "repro": _repro()},
                   {"id": "c-000000000d", "title": "d", "reason": "null keys are kept", "repro": _repro()},
                   {"id": "c-000000000e", "title": "e", "reason": "fixed since", "repro": _repro()}],
        "cells": {"t1": {"a": "diverged:0000000000000001@c-000000000a", "b": "diverged:0000000000000002@c-000000000a",
                         "c": "diverged:0000000000000003@c-000000000b", "d": "diverged:0000000000000004@c-000000000c"},
                  "t2": {"a": "diverged:0000000000000005@c-000000000d", "b": "diverged:0000000000000006@c-000000000d",
                         "c": "diverged:0000000000000007@c-000000000d", "d": "diverged:0000000000000008@c-000000000e"}}}))
    results = []
    for template, case, fp, cause in [("t1", "a", "01", "c-1111111111"), ("t1", "b", "02", "c-1111111111"),
                                      ("t1", "c", "03", "c-1111111111"), ("t1", "d", "04", "c-1111111111"),
                                      ("t2", "a", "05", "c-2222222222"), ("t2", "b", "06", "c-2222222222"),
                                      ("t2", "c", "07", "c-3333333333")]:
        result = _result(template, case, "diverged", fp.rjust(16, "0"))
        result.cause = cause
        results.append(result)
    results.append(_result("t2", "d", "match"))
    causes = {c: _cause(c) for c in ("c-1111111111", "c-2222222222", "c-3333333333")}
    new, counts = update_expectations("engine-x", results, directory=tmp_path, causes=causes)
    merged = new.causes["c-1111111111"]
    assert merged.reason.startswith("One mechanism, recorded before as 3 causes (c-000000000a, c-000000000b, "
                                    "c-000000000c)")
    # the same reason twice is kept once, under both ids; every distinct reason is kept
    assert merged.reason.count("tojson escapes ' for HTML") == 1 and "[c-000000000a, c-000000000c]" in merged.reason
    assert "tojson escapes < for HTML" in merged.reason and "https://example.invalid/2" in merged.reason
    assert merged.link == "https://example.invalid/1"
    # d's three cells: two went to one new cause (its heir); the one split off is another mechanism, which d's
    # reason is not known to describe: it waits for its own
    assert new.causes["c-2222222222"].reason == "null keys are kept"
    assert new.causes["c-3333333333"].reason == ""
    assert counts["causes_without_reason"] == 1 and counts["reasons_merged"] == ["c-1111111111"]
    assert (counts["reasons_by_id"], counts["reasons_by_cells"]) == (0, 2)
    assert counts["reasons_dropped"] == ["c-000000000e"]    # its cell matches now
    # recorded again with the same ids, the joined reason is carried by id unchanged
    again, counts = update_expectations("engine-x", results, directory=tmp_path, causes=causes)
    assert again.causes["c-1111111111"].reason == merged.reason and counts["reasons_by_id"] == 2


def test_a_cause_that_keeps_its_id_keeps_its_reason_and_the_cells_it_lost_take_none(tmp_path):
    """A falsely merged old cause (one reason over two mechanisms) re-recorded by mechanism: its id stays with its
    own few cells and its reason with it; the larger mechanism that held most of its cells is not given it."""
    (tmp_path / "engine-x.json").write_text(json.dumps({
        "format": 2, "runner": "engine-x",
        "causes": [{"id": "c-000000000a", "title": "a", "reason": "no loop controls", "repro": _repro()}],
        "cells": {"t1": {case: f"diverged:{i:016d}@c-000000000a" for i, case in enumerate("abcd", 1)}}}))
    results = []
    for i, (case, cause) in enumerate([("a", "c-000000000a"), ("b", "c-4444444444"), ("c", "c-4444444444"),
                                       ("d", "c-4444444444")], 1):
        result = _result("t1", case, "diverged", f"{i:016d}")
        result.cause = cause
        results.append(result)
    causes = {c: _cause(c) for c in ("c-000000000a", "c-4444444444")}
    new, counts = update_expectations("engine-x", results, directory=tmp_path, causes=causes)
    assert new.causes["c-000000000a"].reason == "no loop controls"
    assert new.causes["c-4444444444"].reason == ""
    assert (counts["reasons_by_id"], counts["reasons_by_cells"], counts["causes_without_reason"]) == (1, 0, 1)


def test_a_checked_baseline_is_read_from_its_record(tmp_path, monkeypatch):
    """The parsed record of a checked baseline gives the same expectations; a damaged record is parsed again,
    and a malformed file is refused every time (only checked files get a record)."""
    from conformance.judge import expectations as module

    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path / "cache"))
    source = module.expectations_path("minijinja")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / source.name).write_bytes(source.read_bytes())
    fresh = load_expectations("minijinja", tmp_path / "b")
    [record] = (tmp_path / "cache" / "expectations").rglob("*.marshal")
    parsed = []
    monkeypatch.setattr(module, "_parse", lambda *a: parsed.append(1) or module._build(*a))
    again = load_expectations("minijinja", tmp_path / "b")
    assert not parsed, "a checked baseline's record is read, not parsed again"
    assert (again.cells, again.rules, again.causes, again.status_reasons) == \
        (fresh.cells, fresh.rules, fresh.causes, fresh.status_reasons) and again.cells
    record.write_bytes(b"\x00not marshal")
    assert load_expectations("minijinja", tmp_path / "b").cells == fresh.cells and parsed == [1]
    monkeypatch.undo()
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path / "cache"))
    broken = json.loads(source.read_text())
    template = next(iter(broken["cells"]))
    broken["cells"][template][next(iter(broken["cells"][template]))] = "matches"
    (tmp_path / "b" / source.name).write_text(json.dumps(broken))
    for _ in range(2):
        with pytest.raises(ExpectationsError, match="status must be one of"):
            load_expectations("minijinja", tmp_path / "b")
    # Every edit of a baseline makes a new record: the newest MAX_RECORDS are kept.
    monkeypatch.setattr(module, "MAX_RECORDS", 3)
    small = {"format": 2, "runner": "minijinja", "cells": {}, "causes": []}
    for n in range(5):
        (tmp_path / "b" / source.name).write_text(json.dumps(dict(small, note=n)))
        load_expectations("minijinja", tmp_path / "b")
    assert len(list((tmp_path / "cache" / "expectations").glob("*.marshal"))) == 3
