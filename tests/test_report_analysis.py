"""The report's `properties` and `audit` sections: written by `chatgold check` from the stored records, valid
against their schemas, shown in Markdown and HTML; `chatgold corpus list` shows each template's properties."""
from __future__ import annotations

import json

import pytest

from conformance import schema_validator
from conformance.analysis.audit import collect_pairs, run_audit
from conformance.analysis.properties import PROPERTY_IDS, load_properties
from conformance.cli import main
from conformance.corpus.cases import load_cases
from conformance.corpus.manifest import load_corpus
from conformance.report import check_report, load_report

# Qwen3 and its earlier revision are one of the suite audit's pairs; gpt-oss is in none with them.
TEMPLATES = ["qwen-qwen3-0.6b", "qwen-qwen3-0.6b-a55ee1", "openai-gpt-oss-120b"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis-report")
    selection = [x for t in TEMPLATES for x in ("--template", t)] + ["--case", "chat-single-user"]
    main(["check", "--runner", "hf", "--workers", "1", *selection, "--json", str(out / "r.json"),
          "--markdown", str(out / "s.md"), "--html", str(out / "r.html")])
    return out, load_report(out / "r.json")


def test_sections_validate_and_follow_the_records(checked):
    _, report = checked
    check_report(report)
    section = report["properties"]
    assert (section["templates"], section["recorded"]) == (len(TEMPLATES), len(TEMPLATES))
    for name in PROPERTY_IDS:
        row = section["properties"][name]
        assert row["violation"] + row["exception"] + row["pass"] + row["not-applicable"] == len(TEMPLATES)
    for template in TEMPLATES:
        violated = load_properties(template)["violated"]
        assert sorted({v["property"] for v in section["violations"].get(template, [])}) == sorted(violated)
    audit = report["audit"]  # the pairs among the selected templates only
    within = [p for p in collect_pairs(load_corpus().entries) if p.a in TEMPLATES and p.b in TEMPLATES]
    assert audit["pairs"] == len(within) == 1 and audit["told_apart"] <= audit["pairs"]


def test_markdown_and_html_show_them(checked):
    out, report = checked
    markdown = (out / "s.md").read_text()
    assert f"### Template properties over {len(TEMPLATES)} templates" in markdown
    assert f"### Suite audit: {report['audit']['told_apart']} of {report['audit']['pairs']} revision pairs" in markdown
    html = (out / "r.html").read_text()
    assert 'id="properties"' in html and 'id="audit"' in html
    assert "reasoning-dropped" in html  # Qwen3's intended exception is shown, counted apart


def test_audit_rows_say_how_each_pair_was_found_and_told_apart():
    audit = run_audit(load_corpus().entries, [c.id for c in load_cases()])
    schema_validator("audit.schema.json").validate(audit)
    hows = {row["how"] for row in audit["rows"]}
    assert {"revision", "versioned", "named-fix"} <= hows
    for row in audit["rows"]:
        assert row["found"]
        assert row["told_apart"] == bool(row["by_goldens"]["cases"] or row["by_properties"])
        if not row["told_apart"]:
            assert row["unrevealable"], row  # the gate's rule: a missed pair must say why no case reveals it
    # trl's Gemma 4 templates are ordered versions, one pair per step, not every pair of them
    versioned = [(r["a"], r["b"]) for r in audit["rows"] if r["how"] == "versioned" and "gemma" in r["found"]]
    assert len(versioned) == 4


def test_corpus_list_shows_property_results(capsys):
    assert main(["corpus", "list", "--template", "qwen-qwen3-0.6b"]) == 0
    out = capsys.readouterr().out
    assert "    properties: " in out and "intended exceptions: prefix-stability: reasoning-dropped" in out
    assert main(["corpus", "list", "--template", "qwen-qwen3-0.6b", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["properties"]["prefix-stability"]["exceptions"] == ["reasoning-dropped"]


def test_shard_merge_adds_the_properties_up(tmp_path):
    """Two shards of one selection: the merged properties section counts both shards' templates."""
    from conformance.report import merge_reports

    paths = []
    for index, template in enumerate(TEMPLATES):
        path = tmp_path / f"shard{index}.json"
        main(["check", "--runner", "hf", "--workers", "1", "--template", template, "--case", "chat-single-user",
              "--json", str(path)])
        paths.append(path)
    merged = merge_reports([load_report(p) for p in paths])
    check_report(merged)
    assert merged["properties"]["templates"] == len(TEMPLATES)
    for name in PROPERTY_IDS:
        row = merged["properties"]["properties"][name]
        assert row["templates"] == len(TEMPLATES)
        assert row["violation"] + row["exception"] + row["pass"] + row["not-applicable"] == len(TEMPLATES)
    # Each shard was chosen by template id, one template each: no audit pair lies within one, so none is audited.
    assert "audit" not in merged and all("audit" not in load_report(p) for p in paths)
