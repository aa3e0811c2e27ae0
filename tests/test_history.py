"""`chatgold history`: conformance across engine versions, and the causes each version introduced or fixed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conformance.analysis.history import (
    build_history,
    compare,
    normalise_message,
    signature,
    smallest_edit,
)
from conformance.judge.expectations import Expectations
from conformance.judge.pipeline import RunnerResults
from conformance.judge.status import CellResult, Status


def _results(name: str, cells: dict) -> RunnerResults:
    results = []
    for (template, case), (status, message) in cells.items():
        result = CellResult(name, template, case, status, message=message, refusal="render" if message else None)
        results.append(result)
    return RunnerResults({"name": name}, results, Expectations(name))


def test_compare_groups_introduced_fixed_and_changed_cells_by_cause():
    before = _results("e@1", {("t1", "a"): (Status.MATCH, ""), ("t1", "b"): (Status.ENGINE_RAISED, "boom at 3"),
                              ("t2", "a"): (Status.ENGINE_RAISED, "boom at 4"), ("t2", "b"): (Status.SKIPPED, "")})
    after = _results("e@2", {("t1", "a"): (Status.ENGINE_RAISED, "new (in chat_template:7)"),
                             ("t1", "b"): (Status.MATCH, ""), ("t2", "a"): (Status.ENGINE_RAISED, "other"),
                             ("t2", "b"): (Status.MATCH, "")})
    change = compare(before, after)
    assert change["cells_introduced"] == 1 and change["introduced"][0]["cause"] == "engine-raised: render: new"
    # fixed is grouped by the cause it had before; the skipped-then-matching cell was never compared
    assert change["cells_fixed"] == 1 and change["fixed"][0]["cause"] == "engine-raised: render: boom at N"
    assert change["cells_changed"] == 1
    assert change["changed"][0]["cause"] == "engine-raised: render: boom at N => engine-raised: render: other"
    history = build_history("e", ["1", "2"], [before, after])
    assert history["templates"]["t1"] == {"right": [False, False], "first_right": None, "right_since": None}
    assert history["templates"]["t2"]["right"] == [False, False]


def test_signature_of_a_diverged_cell_is_the_smallest_edit():
    assert smallest_edit("True, 'x'", "true, 'x'") == ("T", "t")
    result = CellResult("e", "t", "c", Status.DIVERGED)
    result.golden_window = {"after": "[1, None]"}
    result.output_window = {"after": "[1, none]"}
    assert signature(result) == "diverged: 'N' -> 'n'"
    assert normalise_message("unknown method: 'x' has no method named 'y' (in chat_template:12)") == \
        "unknown method: '…' has no method named '…'"


def test_history_finds_the_binding_version_that_added_negative_step_slices(tmp_path):
    """minijinja 2.10.0 added `[::-1]` (2.9.0: "cannot convert number to u64"); Qwen3's template reverses its
    messages, so its cells go from engine-raised to match between the two bindings."""
    from runners.minijinja_runner import PYPI_PACKAGE
    from runners.versions import installed_venv

    for version in ("2.9.0", "2.10.2"):
        if installed_venv(f"minijinja-{version}", [f"{PYPI_PACKAGE}=={version}"]) is None:
            pytest.fail(f"minijinja {version} is not installed in the cache: run scripts/setup.sh (tests never "
                        "download)")
    out = tmp_path / "history.json"
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "history", "--runner", "minijinja", "--versions", "2.9.0,v2.10.2",
         "--template", "qwen-qwen3-0.6b", "--case", "chat-single-user", "--case", "chat-multi-turn",
         "--case", "chat-system", "--history-json", str(out), "--json", str(report), "--html",
         str(tmp_path / "report.html"), "--no-cache"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    history = json.loads(out.read_text())
    from conformance import schema_validator

    schema_validator("history.schema.json").validate(history)
    assert [row["version"] for row in history["versions"]] == ["2.9.0", "2.10.2"]
    assert [row["figure"]["passed"] for row in history["versions"]] == [0, 3]
    (change,) = history["changes"]
    assert change["cells_fixed"] == 3 and change["cells_introduced"] == 0
    # The cause is a root cause: the 2.9.0 cells reduced to one confirmed reproducer of the negative-step slice.
    assert history["cause_kind"] == "root"
    (group,) = change["fixed"]
    cause = history["causes"][group["cause"]]
    assert group["cause"].startswith("c-") and "a slice with a step" in cause["title"] and "::-1" in cause["template"]
    assert "cannot convert number to u" in cause["title"] and cause["versions"] == ["2.9.0"]
    assert history["templates"]["qwen-qwen3-0.6b"] == {"right": [False, True], "first_right": "2.10.2",
                                                       "right_since": "2.10.2"}
    from conformance.report import check_report, load_report

    loaded = load_report(report)
    check_report(loaded)
    assert set(loaded["runners"]) == {"minijinja@2.9.0", "minijinja@2.10.2"}
    html = (tmp_path / "report.html").read_text()
    assert 'id="history-changes"' in html and group["cause"] in html and "::-1" in html


def test_history_refuses_a_runner_without_versions_and_a_single_version():
    for argv, needle in ((["--runner", "evaluator", "--versions", "1,2"], "no versions to compare"),
                         (["--runner", "minijinja", "--versions", "2.9.0"], "at least two versions"),
                         (["--runner", "llamacpp", "--versions", "b9093,9093"], "given twice")):
        done = subprocess.run([sys.executable, "-m", "conformance.cli", "history", *argv], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and needle in done.stderr, done.stderr


def test_version_specs_are_normalised_and_checked():
    from runners import parse_spec

    assert parse_spec("llamacpp@b10054") == parse_spec("llamacpp@10054.0.0") == ("llamacpp", "10054")
    assert parse_spec("minijinja@v2.10.2") == ("minijinja", "2.10.2")
    assert parse_spec("minijinja") == ("minijinja", None)
    for bad, needle in (("evaluator@1", "cannot be run at a chosen version"), ("llamacpp@b12", "starts at build"),
                        ("minijinja@../x", "is not a version"), ("llamacpp@latest", "is a number")):
        with pytest.raises(ValueError, match=needle):
            parse_spec(bad)
    # A builtin runner at a chosen version is identified by its name and version (the root-cause cache keys
    # on it); a command harness is not, unless it gives a build.
    from conformance.explain.cache import runner_identity
    from runners import is_builtin

    assert is_builtin("llamacpp@b10054") and is_builtin("minijinja") and not is_builtin("command:'x@1'")
    assert runner_identity({"name": "minijinja@2.10.2", "version": "2.10.2"}, builtin=is_builtin("minijinja@2.10.2"))
