"""`chatgold check` over several runners writes every output; the JSON validates against its schema;
shard reports merge into the unsharded report. Real engines (minijinja, ferrox), real goldens."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conformance.cli import main
from conformance.report import check_report, load_report

TEMPLATES = ["ai21labs-ai21-jamba-reasoning-3b", "allenai-olmo-3-7b-instruct", "01-ai-yi-1.5-9b-chat",
             "abdelkader-dev-quark-flash-1"]
CASES = ["tools-no-parameters", "chat-single-user", "documents-rag", "tool-call-null-content"]


def _selection():
    return [x for t in TEMPLATES for x in ("--template", t)] + [x for c in CASES for x in ("--case", c)]


def validate(report) -> None:
    check_report(report)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    mp = pytest.MonkeyPatch()
    mp.setenv("CHATGOLD_EXPECTATIONS_DIR", str(out / "no-expectations"))  # nothing known: every miss is new
    try:
        status = main(["check", "--runner", "minijinja", "--runner", "ferrox", "--workers", "1", *_selection(),
                       "--json", str(out / "r.json"), "--junit", str(out / "j.xml"), "--markdown", str(out / "s.md"),
                       "--badges", str(out / "badges"), "--html", str(out / "r.html")])
        shards = []
        for index in (1, 2):
            shard_path = out / f"shard{index}.json"
            main(["check", "--runner", "minijinja", "--runner", "ferrox", "--workers", "1", *_selection(),
                  "--shard", f"{index}/2", "--json", str(shard_path)])
            shards.append(shard_path)
        merge_status = main(["report", "merge", str(out / "merged.json"), *map(str, shards),
                             "--html", str(out / "merged.html")])
    finally:
        mp.undo()
    return out, status, merge_status


def test_check_writes_every_output_and_fails_on_unexpected(outputs):
    out, status, _ = outputs
    report = load_report(out / "r.json")
    validate(report)
    assert set(report["runners"]) == {"minijinja", "ferrox"}
    cells = len(TEMPLATES) * len(CASES)
    for name, section in report["runners"].items():
        assert section["cells_total"] == cells
        assert sum(section["verdicts"].values()) == cells
        # every case feature is rolled up, and a template's constructs too
        assert "tools" in section["features"] and "filter:tojson" in section["constructs"]
    assert report["unexpected"] > 0 and status == 1  # no baseline: the known minijinja tojson divergence is new

    suites = ET.parse(out / "j.xml").getroot()
    for suite in suites:
        # One test case per template (its system-out counts every cell of it), then one per change of cause.
        per_template = [c for c in suite.findall("testcase") if c.get("classname") == suite.get("name")]
        assert [c.get("name") for c in per_template] == sorted(TEMPLATES)
        assert sum(int(c.findtext("system-out").split(" cells:")[0]) for c in per_template) == cells
        assert int(suite.get("failures")) == len(suite.findall("testcase/failure"))
    badge = json.loads((out / "badges" / "minijinja.json").read_text())
    section = report["runners"]["minijinja"]
    assert badge["schemaVersion"] == 1 and badge["message"].startswith(f"{section['conformance']:.2f}%")
    if section["figure"]["not_run"]:
        assert badge["message"].endswith(f"of {section['figure']['ran']:.0f}% run")
    markdown = (out / "s.md").read_text()
    assert "| minijinja |" in markdown and "unexpected outcome(s)" in markdown


def test_minijinja_divergence_carries_windows_and_attribution(outputs):
    out, _, _ = outputs
    report = load_report(out / "r.json")
    [cell] = [c for c in report.runner_cells("minijinja")
              if c["template"] == TEMPLATES[0] and c["case"] == "tools-no-parameters"]
    assert cell["status"] == "diverged" and cell["verdict"] == "unexpected-fail"
    assert cell["golden_window"]["after"].startswith("'s current time")
    assert cell["output_window"]["after"].startswith("\\u0027s current time")
    assert cell["attribution"]["construct"] == "filter:tojson"
    assert "tojson" in cell["attribution"]["context"][cell["attribution"]["line"] - cell["attribution"]["context_first_line"]]
    assert report["runners"]["minijinja"]["blamed_constructs"]["filter:tojson"] >= 1


def test_shards_merge_into_the_unsharded_report(outputs):
    out, status, merge_status = outputs
    whole, merged = load_report(out / "r.json"), load_report(out / "merged.json")
    validate(merged)
    shard_reports = [load_report(out / f"shard{i}.json") for i in (1, 2)]
    assert all(s["runners"]["minijinja"]["cells_total"] for s in shard_reports), "the selection must span both shards"
    assert merge_status == status
    for name in whole["runners"]:
        a, b = whole["runners"][name], merged["runners"][name]
        for key in ("counts", "figure", "verdicts", "features", "constructs", "blamed_constructs", "passed",
                    "conformance", "records"):
            assert a[key] == b[key], (name, key)
    assert sorted(whole.cells, key=lambda c: (c["runner"], c["template"], c["case"])) == merged.cells
    assert (out / "merged.html").stat().st_size > 0


def test_merge_rejects_overlapping_shards(outputs, tmp_path):
    out, _, _ = outputs
    from conformance.report import merge_reports

    with pytest.raises(ValueError, match="appears in two shards"):
        merge_reports([load_report(out / "r.json"), load_report(out / "r.json")])


def test_report_ranks_root_causes_with_their_reproducers(outputs):
    out, _, _ = outputs
    report = load_report(out / "r.json")
    section = report["runners"]["minijinja"]
    assert section["causes"] and section["constructs_basis"] == "cause"
    gains = [cause["gain"] for cause in section["causes"]]
    assert gains == sorted(gains, reverse=True) and gains[0] > 0
    by_cell = {(c["template"], c["case"]): c for c in report.runner_cells("minijinja")}
    for cause in section["causes"]:
        assert cause["repro"]["confirmed"] and cause["repro"]["template"]
        for template, case in cause["cells"]:
            assert by_cell[(template, case)]["cause"] == cause["id"]
    html = (out / "r.html").read_text()
    assert 'id="causes-minijinja"' in html and html.index("Root causes") < html.index("Conformance by Jinja construct")
    assert "top root causes" in (out / "s.md").read_text()
    merged = load_report(out / "merged.json")
    validate(merged)
    assert {c["id"] for c in merged["runners"]["minijinja"]["causes"]} == {c["id"] for c in section["causes"]}
