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


@pytest.fixture(scope="module")
def with_baseline(tmp_path_factory):
    """The same selection judged against minijinja's bundled baseline, whole and in two shards."""
    out = tmp_path_factory.mktemp("baseline")
    # armgpt's null-content cell is filed under the cause quark-flash's is, and the two fall in different shards.
    selection = [x for t in TEMPLATES + ["armgpt-armeniangpt-1.0-3b"] for x in ("--template", t)]
    base = ["check", "--runner", "minijinja", "--workers", "1", *selection, *[x for c in CASES for x in ("--case", c)]]
    main([*base, "--json", str(out / "r.json"), "--html", str(out / "r.html")])
    for index in (1, 2):
        main([*base, "--shard", f"{index}/2", "--json", str(out / f"shard{index}.json")])
    return out


def test_a_known_cause_reason_is_written_once(with_baseline):
    from conformance.judge.expectations import load_expectations

    report = load_report(with_baseline / "r.json")
    validate(report)
    section = report["runners"]["minijinja"]
    known = load_expectations("minijinja").causes
    held = [c for c in report.runner_cells("minijinja") if (c.get("expected") or {}).get("cause") in known]
    assert held, "the selection must hold cells the baseline files under a known cause"
    for cell in held:
        cause = known[cell["expected"]["cause"]]
        assert "reason" not in cell["expected"] and "link" not in cell["expected"]
        said = section["expected_causes"][cause.id]
        assert said["reason"] == (cause.reason or cause.title) and said.get("link", "") == cause.link
    html = (with_baseline / "r.html").read_text()
    for cause_id, said in section["expected_causes"].items():
        assert html.count(f'id="expected-minijinja-{cause_id}"') == 1
        assert f'href="#expected-minijinja-{cause_id}"' in html
    section["expected_causes"].clear()  # a record whose reason is nowhere is malformed, not silently reasonless
    with pytest.raises(ValueError, match="held against a cause with no reason"):
        validate(report)


def test_merge_keeps_each_shards_reason(with_baseline, tmp_path):
    from conformance.report import merge_reports

    shards = [load_report(with_baseline / f"shard{i}.json") for i in (1, 2)]
    whole = load_report(with_baseline / "r.json")
    assert merge_reports(shards)["runners"]["minijinja"]["expected_causes"] == \
        whole["runners"]["minijinja"]["expected_causes"]
    # A shard that read another baseline: its cells keep their own reason, inline.
    shards = [load_report(with_baseline / f"shard{i}.json") for i in (1, 2)]
    second = shards[1]["runners"]["minijinja"]["expected_causes"]
    first = shards[0]["runners"]["minijinja"]["expected_causes"]
    shared = sorted(first.keys() & second.keys())
    assert shared, "both shards must hold a cell of one known cause"
    second[shared[0]] = {"reason": "written on another machine"}
    merged = merge_reports(shards)
    validate(merged)
    section = merged["runners"]["minijinja"]
    assert section["expected_causes"][shared[0]] == first[shared[0]]
    theirs = {(c["template"], c["case"]) for c in shards[1].cells if c["expected"].get("cause") == shared[0]}
    for cell in merged.runner_cells("minijinja"):
        if (cell["template"], cell["case"]) in theirs:
            assert cell["expected"]["reason"] == "written on another machine"
        elif (cell.get("expected") or {}).get("cause") == shared[0]:
            assert "reason" not in cell["expected"]


def test_cell_lines_are_jsons_bytes():
    """orjson writes the cell records: the bytes json's compact, non-ASCII encoder gives, for every string a
    record can hold (controls, separators, non-BMP, lone surrogates through the fallback)."""
    import random

    from conformance.files import ENCODING_ERRORS
    from conformance.report import _cell_line

    rng = random.Random(7)
    alphabet = [chr(c) for c in (*range(0x00, 0x80), 0x7F, 0x85, 0xA0, 0x2028, 0x2029, 0xFEFF, 0x1F600, 0x10FFFF,
                                 0xD800, 0xDFFF, 0x22, 0x5C, 0xE9)]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        record = {"runner": "r", "template": text, "case": "c", "offset": rng.randrange(-5, 10**12),
                  "verdict": None, "flag": rng.random() < 0.5, "context": [text, {"k": text}]}
        expected = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8", ENCODING_ERRORS)
        assert _cell_line(record) == expected, repr(text)


def test_a_format_2_report_is_still_read(with_baseline, tmp_path):
    """Reports written before format 3 (every reason inline, no expected_causes) load, check and merge."""
    import gzip

    from conformance.report import merge_reports

    for index in (1, 2):
        data = json.loads((with_baseline / f"shard{index}.json").read_text())
        cells = [json.loads(line) for line in gzip.open(with_baseline / data["cells_file"], "rt")]
        for name, section in data["runners"].items():
            said = section.pop("expected_causes")
            for record in [c for c in cells if c["runner"] == name] + section["unexpected_cells"]:
                expected = record.get("expected") or {}
                if "reason" not in expected and expected.get("cause") in said:
                    expected.update(said[expected["cause"]])
        data["format"] = 2
        (tmp_path / f"old{index}.json").write_text(json.dumps(data))
        with gzip.open(tmp_path / data["cells_file"], "wt") as handle:
            handle.writelines(json.dumps(c) + "\n" for c in cells)
    old = [load_report(tmp_path / f"old{i}.json") for i in (1, 2)]
    for report in old:
        validate(report)
    merged = merge_reports(old)
    validate(merged)
    assert all("reason" in c["expected"] for c in merged.cells if c.get("expected"))
