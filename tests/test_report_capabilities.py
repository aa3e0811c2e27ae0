"""Issue 8: the report's llamacpp capability agreement section, with the real llama-server (built and cached
under ~/.cache/chatgold) against the stored capability goldens: `chatgold check`, the pytest gate, and a
summary loaded with `chatgold check --capability-agreement`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.report import check_report, load_report, merge_reports

REPO = Path(__file__).resolve().parent.parent
# deepseek-v3.1: llama.cpp's generation prompt leaves out the reference's closed empty think block, so the
# selection has at least one disagreement for the HTML to list.
TEMPLATES = ["qwen-qwen2.5-7b-instruct", "google-gemma-2-2b-it", "meta-llama-llama-3.1-8b-instruct",
             "deepseek-ai-deepseek-v3.1"]
CASES = ["chat-single-user"]


def _selection(prefix="--"):
    return ([x for t in TEMPLATES for x in (f"{prefix}template", t)]
            + [x for c in CASES for x in (f"{prefix}case", c)])


def validate(report) -> None:
    check_report(report)


@pytest.fixture(scope="session")
def llama_server_binary():
    from runners.llamacpp import build_llama_server

    return build_llama_server()


@pytest.fixture(scope="module")
def checked(tmp_path_factory, llama_server_binary):
    out = tmp_path_factory.mktemp("capreport")
    mp = pytest.MonkeyPatch()
    mp.setenv("CHATGOLD_EXPECTATIONS_DIR", str(out / "no-expectations"))
    try:
        main(["check", "--runner", "llamacpp", "--workers", "1", *_selection(), "--json", str(out / "r.json"),
              "--markdown", str(out / "s.md"), "--html", str(out / "r.html")])
    finally:
        mp.undo()
    return out, load_report(out / "r.json")


def _check_section(section: dict, template_count: int) -> None:
    assert section["templates"] == template_count
    assert section["engine"]["name"] == "llamacpp"
    assert {"generation_prompt", "supports_system_role", "supports_tools"} <= set(section["capabilities"])
    for name, row in section["capabilities"].items():
        # every template is counted once per capability, as agreement, disagreement or unknown
        assert row["agree"] + row["disagree"] + row["unknown"] == template_count, name
        assert row["compared"] == row["agree"] + row["disagree"]
        if row["compared"]:
            assert row["agreement"] == round(row["agree"] / row["compared"], 4)
        assert len(row["disagreements"]) == row["disagree"]  # few templates: every one is listed
        assert {d["template"] for d in row["disagreements"]} <= set(TEMPLATES)


def test_check_with_llamacpp_carries_the_section_and_validates(checked):
    _, report = checked
    validate(report)
    _check_section(report["capability_agreement"], len(TEMPLATES))
    gp = report["capability_agreement"]["capabilities"]["generation_prompt"]
    assert gp["disagree"] >= 1 and gp["agree"] >= 1  # the selection is built to have both


def test_markdown_shows_the_agreement_table(checked):
    out, report = checked
    text = (out / "s.md").read_text()
    assert "llamacpp capability agreement over 4 templates" in text
    assert "| capability | compared | agree | agreement | unknown |" in text
    for name, row in report["capability_agreement"]["capabilities"].items():
        pct = "n/a" if row["agreement"] is None else f"{100 * row['agreement']:.1f}%"
        assert f"| `{name}` | {row['compared']} | {row['agree']} | {pct} | {row['unknown']} |" in text


class _TableText(HTMLParser):
    """Text of each row of the table with the given id."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.inside, self.rows = table_id, False, []

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif tag == "tr" and self.inside:
            self.rows.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows:
            self.rows[-1] += data


def test_html_lists_the_disagreeing_templates(checked):
    out, report = checked
    parser = _TableText("capability-agreement")
    parser.feed((out / "r.html").read_text())
    assert len(parser.rows) - 1 == len(report["capability_agreement"]["capabilities"])
    for name, row in report["capability_agreement"]["capabilities"].items():
        text = next(r for r in parser.rows[1:] if r.startswith(name + str(row["compared"])))
        for d in row["disagreements"]:
            assert d["template"] in text
        if not row["disagreements"]:
            assert text.endswith("–")


def test_a_run_without_llamacpp_has_no_section(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "none"))
    main(["check", "--runner", "minijinja", "--workers", "1", "--template", TEMPLATES[0], "--case", CASES[0],
          "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "s.md"), "--html", str(tmp_path / "r.html")])
    report = load_report(tmp_path / "r.json")
    validate(report)
    assert "capability_agreement" not in report
    assert "capability agreement" not in (tmp_path / "s.md").read_text()
    assert 'id="capability-agreement"' not in (tmp_path / "r.html").read_text()


def test_precomputed_summary_is_loaded(tmp_path, monkeypatch, llama_server_binary):
    summary = tmp_path / "agreement.json"
    assert main(["capabilities", "compare", "--runner", "llamacpp", "--workers", "1", "--template", TEMPLATES[3],
                 "--template", TEMPLATES[0], "--out", str(summary)]) == 0
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "none"))
    main(["check", "--runner", "minijinja", "--workers", "1", "--template", TEMPLATES[0], "--case", CASES[0],
          "--capability-agreement", str(summary), "--json", str(tmp_path / "r.json"),
          "--markdown", str(tmp_path / "s.md")])
    report = load_report(tmp_path / "r.json")
    validate(report)
    section = report["capability_agreement"]
    assert section["source"] == str(summary)
    _check_section(section, 2)
    assert section["capabilities"] == json.loads(summary.read_text())["capabilities"]
    assert "llamacpp capability agreement over 2 templates" in (tmp_path / "s.md").read_text()


def test_a_bad_summary_file_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "not-agreement.json"
    bad.write_text(json.dumps({"format": 1, "capabilities": {"supports_tools": {"agree": "3"}}}))
    status = main(["check", "--runner", "minijinja", "--template", TEMPLATES[0], "--case", CASES[0],
                   "--capability-agreement", str(bad)])
    assert status != 0
    err = capsys.readouterr().err
    assert str(bad) in err and "supports_tools" in err


def test_shard_reports_merge_their_agreement(checked, tmp_path, monkeypatch):
    _, report = checked
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "none"))
    shards = []
    for index in (1, 2):
        path = tmp_path / f"shard{index}.json"
        main(["check", "--runner", "llamacpp", "--workers", "1", *_selection(), "--shard", f"{index}/2",
              "--json", str(path)])
        shards.append(load_report(path))
    assert all(s["capability_agreement"]["templates"] for s in shards)  # both shards have templates
    merged = merge_reports(shards)
    validate(merged)
    section = merged["capability_agreement"]
    _check_section(section, len(TEMPLATES))
    for name, row in section["capabilities"].items():
        whole = report["capability_agreement"]["capabilities"][name]
        assert {k: row[k] for k in ("agree", "disagree", "unknown", "agreement")} == \
            {k: whole[k] for k in ("agree", "disagree", "unknown", "agreement")}
        assert sorted(d["template"] for d in row["disagreements"]) == sorted(d["template"] for d in whole["disagreements"])


def _plugin_args():
    from importlib.metadata import entry_points

    installed = any(e.name == "chatgold" for e in entry_points(group="pytest11"))
    return [] if installed else ["-p", "conformance.gate.plugin"]


def test_the_gate_report_carries_the_section(tmp_path, llama_server_binary):
    env = dict(os.environ, CHATGOLD_EXPECTATIONS_DIR=str(tmp_path / "none"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(), "-q", "--pyargs",
         "conformance.gate", "-k", "test_engine_matches_expectations", "--chatgold-runner", "llamacpp",
         "--chatgold-workers", "1", *_selection("--chatgold-"), f"--chatgold-report={tmp_path / 'reports'}"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report_path = tmp_path / "reports" / "report.json"
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-2000:]
    report = load_report(report_path)
    validate(report)
    _check_section(report["capability_agreement"], len(TEMPLATES))
    assert "llamacpp capability agreement" in (tmp_path / "reports" / "summary.md").read_text()
    assert 'id="capability-agreement"' in (tmp_path / "reports" / "report.html").read_text()
