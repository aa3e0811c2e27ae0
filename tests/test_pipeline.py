"""The one pipeline and its truthful verdicts: refusals match only refusals of the same kind, skipped cells are
outside the conformance figure in every output, report/ is a pure output stage. Real engines, real goldens."""
from __future__ import annotations

import ast
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.judge.expectations import Expectations
from conformance.checkrun import check_cells
from conformance.judge.pipeline import RunnerResults, Selection, apply_expectations
from conformance.judge.status import CellResult, Status, figure
from conformance.report import build_report, check_report, load_report, merge_reports
from conformance.report.html import render_html
from conformance.report.render import badge, markdown, terminal
from runners import get_runner
from runners.base import Rendered

ROOT = Path(__file__).resolve().parent.parent
# Templates that use {% generation %}: MiniJinja 3.1.0 cannot compile them, the reference can.
GENERATION = ["arcee-ai-trinity-large-preview", "abdelkareem-supra-50m-arabic-sft-mix"]


def test_an_engine_that_cannot_compile_has_no_matching_cell():
    selection = Selection.load(GENERATION)
    assert len(selection.templates) == 2
    for template in selection.templates:
        assert "generation" in template.source()
    with get_runner("minijinja", workers=1) as runner:
        results = check_cells(runner, selection.cells())
    counts = results.counts()
    assert counts["match"] == counts["both-raised"] == 0, counts
    # Where the reference refused too (its raise_exception), the engine's compile failure is another kind.
    assert counts["raised-differently"] > 0 and counts["engine-raised"] > 0
    differently = [r for r in results.results if r.status == Status.RAISED_DIFFERENTLY]
    assert all(r.refusal == "compile" and r.reference_refusal != "compile" for r in differently)
    assert all("generation" in r.message for r in differently)


def test_a_raise_exception_matches_only_with_its_message(tmp_path):
    # The reference refuses this cell with the template's raise_exception("...roles must alternate...").
    selection = Selection.load(["abacusai-smaug-mixtral-v0.1"], ["chat-system"])
    [cell] = selection.cells()
    with get_runner("evaluator") as runner:
        [result] = check_cells(runner, [cell]).results
    assert result.status == Status.BOTH_RAISED and result.refusal == "raise"


def test_the_figure_leaves_skipped_and_goldenless_cells_out():
    counts = {"match": 6, "diverged": 2, "skipped": 2, "no-golden": 1}
    assert figure(counts) == {"cells": 11, "judged": 8, "passed": 6, "not_run": 3, "conformance": 75.0,
                              "ran": 72.73}
    assert figure({})["conformance"] is None


def test_skipped_cells_are_outside_the_denominator_in_every_output(tmp_path, monkeypatch):
    # chatml-builtin skips cells with tools or documents; they are counted and shown, never a failure.
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "none"))
    status = main(["check", "--runner", "chatml-builtin", "--workers", "1", "--template", "qwen-qwen2.5-7b-instruct",
                   "--case", "chat-single-user", "--case", "documents-rag", "--case", "tools-one",
                   "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                   "--markdown", str(tmp_path / "s.md"), "--badges", str(tmp_path / "badges"),
                   "--html", str(tmp_path / "r.html")])
    report = load_report(tmp_path / "r.json")
    check_report(report)
    section = report["runners"]["chatml-builtin"]
    fig = section["figure"]
    assert fig["not_run"] == section["counts"]["skipped"] == 2 and fig["judged"] == 1
    # The one judged cell, judged here without the pipeline: the engine's bytes against the golden file's.
    [cell] = Selection.load(["qwen-qwen2.5-7b-instruct"], ["chat-single-user"]).cells()
    with get_runner("chatml-builtin", workers=1) as runner:
        rendered = runner.render(cell.request)
    assert isinstance(rendered, Rendered), rendered
    golden = (ROOT / "goldens" / "qwen-qwen2.5-7b-instruct" / "chat-single-user.txt").read_bytes()
    matches = rendered.text.encode("utf-8") == golden
    assert fig["conformance"] == (100.0 if matches else 0.0)
    assert section["counts"]["match"] == int(matches)
    assert section["verdicts"]["not-run"] == 2 and section["unexpected"] == (0 if matches else 1)
    assert status == (0 if matches else 1)
    # JUnit: skipped, not failed; badge and Markdown say how much ran; HTML shows the skip reasons.
    suite = ET.parse(tmp_path / "j.xml").getroot()[0]
    [template_case] = [c for c in suite.findall("testcase") if c.get("classname") == "chatgold.chatml-builtin"]
    assert template_case.findtext("system-out").startswith("3 cells: ") and ", 2 not run" in template_case.findtext(
        "system-out") and (template_case.find("failure") is None) == bool(fig["conformance"])
    badge = json.loads((tmp_path / "badges" / "chatml-builtin.json").read_text())
    assert badge["message"].endswith(f"of {fig['ran']:.0f}% run")
    assert f"| {fig['ran']:.2f}% |" in (tmp_path / "s.md").read_text()
    skipped = [c for c in report.cells if c["status"] == "skipped"]
    assert len(skipped) == 2 and all("tools or documents" in c["message"] for c in skipped)
    assert "tools<span class=\"ws\">·</span>or" in (tmp_path / "r.html").read_text()


def test_every_non_matching_cell_has_a_record_with_the_engines_message(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "none"))
    main(["check", "--runner", "minijinja", "--workers", "1", "--template", GENERATION[0], "--json",
          str(tmp_path / "r.json"), "--no-attribution"])
    report = load_report(tmp_path / "r.json")
    check_report(report)  # one record per cell that is not a pass, counted against the summary
    section = report["runners"]["minijinja"]
    assert report["cell_records"] == section["cells_total"] == len(report.cells)
    refused = [c for c in report.cells if c["status"] in ("engine-raised", "raised-differently")]
    assert refused and all(c["message"] and c["refusal"] == "compile" for c in refused)
    assert all(c["reference_message"] for c in refused if c["status"] == "raised-differently")


def _imports(path: Path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "conformance" / "report").glob("*.py")), ids=lambda p: p.name)
def test_report_is_a_pure_output_stage(path):
    imported = _imports(path)
    assert not {m for m in imported if m == "runners" or m.startswith("runners.")}, imported
    assert not {m for m in imported if m.startswith(("conformance.judge.goldens", "conformance.judge.pipeline",
                                                     "conformance.judge.attribution"))}, imported


def test_every_output_shows_the_one_conformance_figure():
    """Two templates, every kind of status: the runner's figure, each construct's row, the terminal, Markdown,
    badge and HTML outputs and a merge all show the figure worked out here by hand."""
    plan = {"t-a": ["match", "match", "diverged", "skipped"],
            "t-b": ["match", "both-raised", "engine-raised", "no-golden", "diverged", "timeout"]}
    results = [CellResult("eng", t, f"c{i}", Status(s)) for t, statuses in plan.items() for i, s in enumerate(statuses)]
    expectations = Expectations("eng")
    apply_expectations(results, expectations)
    metadata = {"cases": {}, "templates": {"t-a": {"family": "a", "constructs": ["filter:x"]},
                                           "t-b": {"family": "b", "constructs": ["filter:y"]}}}
    report = build_report([RunnerResults({"name": "eng"}, results, expectations)], {}, metadata)
    # 10 cells; skipped and no-golden are not run: 8 judged; match + both-raised: 4 passed.
    section = report["runners"]["eng"]
    assert section["figure"] == {"cells": 10, "judged": 8, "passed": 4, "not_run": 2, "conformance": 50.0,
                                 "ran": 80.0}
    # filter:x: t-a, 2 of 3 judged; filter:y: t-b, 2 of 5 judged.
    assert section["constructs"]["filter:x"]["conformance"] == 66.67
    assert section["constructs"]["filter:y"]["conformance"] == 40.0
    assert "ran 80.0% of 10 cells; 50.00% of 8 match" in terminal(report)
    assert "| eng | 50.00% | 80.00% | 10 | 4 |" in markdown(report)
    assert badge(section)["message"] == "50.00% of 80% run"
    page = render_html(report)
    assert "ran 80.0% of 10 cells; 50.00% of 8 match" in page
    assert ">filter:x</td><td class=\"c50\" title=\"2/4 match, 1 diverged\">66.7%<" in page
    assert ">filter:y</td><td class=\"c0\" title=\"2/6 match, 1 diverged\">40.0%<" in page
    merged = merge_reports([report])
    assert merged["runners"]["eng"]["figure"] == section["figure"]
    assert merged["runners"]["eng"]["constructs"]["filter:y"]["conformance"] == 40.0


def test_a_match_built_from_the_defaults_is_the_match_the_constructor_builds():
    """CellResult.matched (the judge's path for most cells) equals the constructor's result, field for field,
    and no two results share a later stage's field."""
    from conformance.judge.classify import MATCHED, result_for
    from conformance.judge.goldens import Golden

    outcome = Rendered("hi")
    built = CellResult("r", "t", "c", Status.MATCH, golden_kind="rendered", seconds=0.5, outcome=outcome,
                       judgement=MATCHED)
    fast = CellResult.matched("r", "t", "c", outcome, MATCHED, 0.5)
    assert vars(fast) == vars(built) and fast == built
    judged = result_for("r", "t", "c", Golden("rendered", b"hi"), outcome)
    assert vars(judged) == vars(CellResult("r", "t", "c", Status.MATCH, golden_kind="rendered", outcome=outcome,
                                            judgement=MATCHED))
    judged.cause = "c-1"
    assert CellResult.matched("r", "t", "c", outcome, MATCHED).cause is None
