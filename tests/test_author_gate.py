"""The engine author's path, tried from outside (issue 31): an honest `harness validate`, baselines that are the
author's own, the gate's change summary by cause, replaying a cause, report sizes and progress in CI logs."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LACKING = ROOT / "tests" / "harnesses" / "lacking.py"
PROTOCOL = ROOT / "runners" / "protocol"


def chatgold(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    environment.pop("CHATGOLD_EXPECTATIONS_DIR", None)
    return subprocess.run([sys.executable, "-m", "conformance.cli", *map(str, args)], cwd=cwd or ROOT,
                          env=environment, capture_output=True, text=True, timeout=timeout)


# -- 1. harness validate: a missing global or an `unsupported` refusal is a DIFF ---------------------------------

def _validate(*flags):
    from runners.protocol.validate import validate_harness

    out = io.StringIO()
    result = validate_harness([sys.executable, str(LACKING), *flags], out=out, timeout=20)
    return result, out.getvalue()


def test_an_engine_without_raise_exception_or_strftime_now_differs_and_conforms():
    result, text = _validate("--no-raise-exception", "--no-strftime-now", "--no-trim-blocks", "--protocol", "1")
    assert result, text
    assert result.protocol == 1
    assert re.search(r"^DIFF refusal-raise: the engine does not bind `raise_exception`", text, re.M), text
    assert re.search(r"^DIFF strftime_now: the engine does not bind `strftime_now`", text, re.M), text
    assert re.search(r"^DIFF trim_blocks: ", text, re.M), text
    assert "FAIL" not in text


def test_a_refusal_of_kind_unsupported_is_accepted_as_a_difference():
    result, text = _validate("--unsupported")
    assert result, text
    assert re.search(r"^DIFF refusal-compile: the engine declines the template as a whole: raised \(unsupported\)",
                     text, re.M), text


def test_raise_exceptions_message_under_the_wrong_kind_still_fails(tmp_path):
    """The leniency is for engines that lack the global, not for harnesses that mislabel a refusal."""
    harness = tmp_path / "mislabel.py"
    harness.write_text(
        "import sys\nsys.path.insert(0, %r)\nimport minimal_harness\nfaithful = minimal_harness.render_with_engine\n"
        "def engine(*a):\n    o = faithful(*a)\n    return ('raised', 'render', o[2]) if o[0] == 'raised' and o[1] == "
        "'raise' else o\nminimal_harness.render_with_engine = engine\nminimal_harness.main()\n"
        % str(ROOT / "runners" / "examples"))
    from runners.protocol.validate import validate_harness

    out = io.StringIO()
    assert not validate_harness([sys.executable, str(harness)], out=out)
    assert "FAIL refusal-raise: expected a refusal of kind raise" in out.getvalue()


def test_validate_first_line_is_what_the_harness_sent():
    _, text = _validate("--name", "Exactly-This", "--build", "b7")
    first = text.splitlines()[0]
    assert first.startswith("ok   start: the harness answered {")
    assert text.splitlines()[1].startswith("note start: build 'b7': chatgold reuses this harness's outcomes")
    sent = json.loads(first.split("answered ", 1)[1])
    assert sent == {"name": "Exactly-This", "version": "1", "language": "python",
                    "homepage": "https://jinja.palletsprojects.com/", "build": "b7", "protocol": 2}


def test_protocol_md_introduction_table_and_schema_agree_on_the_refusal_kinds():
    schema = json.loads((PROTOCOL / "render-response.schema.json").read_text())
    kinds = set(schema["$defs"]["message"]["properties"]["kind"]["enum"])
    text = (PROTOCOL / "PROTOCOL.md").read_text()
    intro = re.search(r"every refusal says its \*\*kind\*\*:(.*?);", text, re.S).group(1)
    table = set(re.findall(r"^\| `([a-z]+)` \| .*\| (?:jinja2|any other|nothing)", text, re.M))
    assert set(re.findall(r"`([a-z]+)`", intro)) == kinds
    assert table == kinds


# -- 2, 3. a command: harness's baseline is the author's own ---------------------------------------------------

def _harness(*flags) -> str:
    return "command:" + " ".join([sys.executable, str(LACKING), *flags])


def test_a_harness_named_after_a_bundled_runner_is_not_judged_against_its_baseline(tmp_path):
    """A faithful harness calling itself minijinja, on a template minijinja's baseline lists 4 cells of: against
    that baseline they would read "now passing"; the harness never recorded it, so nothing is known."""
    template = "abdelkader-dev-quark-flash-1"
    done = chatgold("check", "--runner", _harness("--name", "minijinja"), "--template", template, "--no-explain",
                    "--no-attribution", "--json", tmp_path / "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    section = json.loads((tmp_path / "r.json").read_text())["runners"]["minijinja"]
    assert section["expectations"] == {"file": "chatgold-expectations/minijinja.json", "known": 0}
    assert section["verdicts"]["unexpected-pass"] == 0 and section["verdicts"]["expected-pass"] == 95
    assert "no baseline at chatgold-expectations/minijinja.json" in done.stderr
    # Pointing a command: harness at the suite's own folder is refused, by name.
    done = chatgold("check", "--runner", _harness("--name", "minijinja"), "--template", template, "--no-explain",
                    "--expectations", ROOT / "conformance" / "expectations", cwd=tmp_path)
    assert done.returncode == 2 and "the suite's own baselines" in done.stderr, done.stderr


def test_expectations_update_writes_into_the_current_directory_never_the_package(tmp_path):
    suite = ROOT / "conformance" / "expectations"
    before = {p.name: p.stat().st_mtime_ns for p in suite.iterdir()}
    spec = _harness("--name", "minijinja", "--no-raise-exception")
    template = "abacusai-smaug-mixtral-v0.1"
    done = chatgold("expectations", "update", "--runner", spec, "--template", template, "--no-explain",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads((tmp_path / "chatgold-expectations" / "minijinja.json").read_text())
    assert recorded["runner"] == "minijinja" and template in recorded["cells"]
    assert {p.name: p.stat().st_mtime_ns for p in suite.iterdir()} == before
    # check reads the same folder by default: what was recorded is known.
    done = chatgold("check", "--runner", spec, "--template", template, "--no-explain", "--no-attribution",
                    cwd=tmp_path)
    assert done.returncode == 0 and "unexpected outcomes: 0" in done.stdout, done.stdout + done.stderr
    # A runner the suite ships is re-recorded only into a folder named on the command line.
    done = chatgold("expectations", "update", "--runner", "evaluator", "--template", template, cwd=tmp_path)
    assert done.returncode == 2 and "--expectations conformance/expectations" in done.stderr, done.stderr
    assert {p.name: p.stat().st_mtime_ns for p in suite.iterdir()} == before


# -- 9. progress lines in a CI log ------------------------------------------------------------------------------

def test_check_prints_progress_lines_at_an_interval_when_not_a_terminal(tmp_path):
    done = chatgold("check", "--runner", _harness("--delay", "0.01"), "--template", "abacusai-smaug-mixtral-v0.1",
                    "--template", "abdelkader-dev-quark-flash-1", "--no-cache", "--workers", "1", "--no-explain",
                    "--no-attribution", "--expectations", tmp_path / "none", cwd=tmp_path,
                    env={"CHATGOLD_PROGRESS_INTERVAL": "0.2"})
    lines = [line for line in done.stderr.splitlines() if line.startswith("chatgold progress: ")]
    assert len(lines) >= 3, done.stderr  # 190 renders of 10 ms or more: about 2 s, a line every 0.2 s
    pattern = re.compile(r"chatgold progress: command:\S+ \S+ --delay 0.01: (\d+)/190 cells rendered \(\d+%\), "
                         r"\d+:\d\d elapsed(, about \d+:\d\d left|, done)$")
    counts = [int(pattern.match(line).group(1)) for line in lines]
    assert counts == sorted(counts) and counts[-1] == 190 and lines[-1].endswith(", done")
    assert any("left" in line for line in lines)
    # A terminal-less run without the setting still prints at the default interval, and 0 turns it off.
    done = chatgold("check", "--runner", _harness(), "--template", "abdelkader-dev-quark-flash-1", "--no-explain",
                    "--no-attribution", "--expectations", tmp_path / "none", cwd=tmp_path,
                    env={"CHATGOLD_PROGRESS_INTERVAL": "0"})
    assert "chatgold progress" not in done.stderr


# -- 4. the change summary by cause, on the terminal, in Markdown and in JUnit ----------------------------------

def test_the_gate_names_new_fixed_and_moved_causes_everywhere(tmp_path):
    """Baseline: an engine without strftime_now. Then the author fixes strftime_now and breaks raise_exception:
    the strftime_now cause (one missing global, one cause) is fixed, raise_exception's is new, and the two cells that refused on
    strftime_now before the reference's raise_exception now refuse on raise_exception: moved."""
    import xml.etree.ElementTree as ET

    template = "dphn-dolphin-mistral-24b-venice-edition"
    selection = ["--template", template, "--case", "developer*", "--case", "chat-*"]  # 13 cases
    done = chatgold("expectations", "update", "--runner", _harness("--no-strftime-now"), *selection, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    baseline = json.loads((tmp_path / "chatgold-expectations" / "lacking-jinja2.json").read_text())
    old = {c["id"]: c["title"] for c in baseline["causes"]}
    done = chatgold("check", "--runner", _harness("--no-raise-exception"), *selection, "--no-attribution",
                    "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "s.md", "--json", tmp_path / "r.json",
                    "--html", tmp_path / "r.html",
                    cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    section = json.loads((tmp_path / "r.json").read_text())["runners"]["lacking-jinja2"]
    [new] = [c for c in section["causes"] if not c["known"]]
    assert new["id"] not in old and len(new["cells"]) == 2
    out = done.stdout
    assert "    cells: 0 known, 0 new, 2 changed, 11 now passing, 0 not run" in out
    assert "    causes: 1 new, 1 fixed, 2 cells moved to another cause" in out
    assert f"      NEW   {new['id']} {new['title']} (2 cells)" in out
    for cause_id, title in old.items():
        assert f"      FIXED {cause_id} {title}: its reproducer no longer differs" in out
    [moved_from] = old  # the one missing global is one cause
    assert f"      MOVED 2 cells from {moved_from} {old[moved_from]} to {new['id']} {new['title']}" in out
    assert out.count(f"its cause changed from {moved_from} to {new['id']}") == 2
    markdown = (tmp_path / "s.md").read_text()
    assert "### Changes by root cause" in markdown and "**lacking-jinja2**: 1 new, 1 fixed, 2 cells moved" in markdown
    assert f"- new `{new['id']}` " in markdown and f"- moved 2 cells from `{moved_from}`" in markdown
    assert all(f"- fixed `{c}` " in markdown for c in old)
    html = (tmp_path / "r.html").read_text()
    assert "<h2>Changes by root cause</h2><p><b>lacking-jinja2</b>: 1 new, 1 fixed, 2 cells moved</p>" in html
    suite = ET.parse(tmp_path / "j.xml").getroot()[0]
    names = {case.get("name"): case for case in suite.findall("testcase")}
    assert names[f"new cause {new['id']}: {new['title']}"].find("failure") is not None
    assert all(names[f"fixed cause {c}: {t}"].find("failure") is None for c, t in old.items())
    assert names[f"moved 2 cell(s) from cause {moved_from} to {new['id']}"].find("failure") is not None
    template_case = names[template]
    assert template_case.find("failure").get("message") == "2 unexpected cell(s) of 13"
    assert template_case.find("system-out").text == "13 cells: 0 match, 2 unexpected, 11 now passing (update the baseline)"
    assert int(suite.get("tests")) == 4 and int(suite.get("failures")) == 3  # template, new, fixed, moved


# -- 5. replaying a cause --------------------------------------------------------------------------------------

def test_render_replays_a_baseline_cause_through_the_runner(tmp_path):
    """A baseline recorded by hand (as `expectations update` writes it) with one cause: the harness without
    raise_exception still differs, the faithful one no longer does."""
    cause = {"id": "c-0123456789", "title": "the engine refuses raise_exception", "reason": "", "constructs": [],
             "symptom": {"status": "raised-differently"},
             "repro": {"template": "{{ raise_exception('no') }}", "case": {"messages": [{"role": "user", "content": "x"}]},
                       "bos_token": None, "eos_token": None,
                       "reference": {"kind": "raised", "message": "TemplateError: no", "refusal": "raise"},
                       "engine": {"kind": "raised", "message": "UndefinedError: 'raise_exception' is undefined"}}}
    folder = tmp_path / "chatgold-expectations"
    folder.mkdir()
    (folder / "lacking-jinja2.json").write_text(json.dumps({"format": 2, "runner": "lacking-jinja2",
                                                            "causes": [cause], "cells": {}}))
    done = chatgold("render", "--cause", cause["id"], "--runner", _harness("--no-raise-exception"), cwd=tmp_path)
    assert done.returncode == 3, done.stderr  # the engine refused, as render says with 3
    assert f"cause {cause['id']}: {cause['title']}" in done.stderr
    assert "engine (now):         raised \"UndefinedError: 'raise_exception' is undefined\"" in done.stderr
    assert "still differs from the reference" in done.stderr
    done = chatgold("render", "--cause", cause["id"], "--runner", _harness(), cwd=tmp_path)
    assert "engine (now):         raised \"TemplateError: no\"" in done.stderr
    assert "the engine now gives the reference's outcome" in done.stderr
    done = chatgold("render", "--cause", "c-nothere", "--runner", _harness(), cwd=tmp_path)
    assert done.returncode == 2 and "no cause c-nothere (it has 1: c-0123456789)" in done.stderr
    assert "command:'<argv>'" in chatgold("render", "--help").stdout


def test_the_html_report_gives_each_cause_as_a_command_and_counts_as_integers():
    from conformance.report import Report
    from conformance.report.changes import cause_command
    from conformance.report.html import _causes

    section = {"runner": {"name": "minijinja"}, "expectations": {"file": "x/minijinja.json"},
               "explain_stats": {"median_lines": 62.0, "median_messages": 1.0},
               "causes": [{"id": "c-1", "title": "t", "gain": 1.0, "templates": 1, "cells": [["a", "b"]],
                           "constructs": [], "statuses": {"diverged": 1},
                           "repro": {"template": "x", "case": {"messages": []}, "lines": 1, "messages": 0,
                                     "reference": {"kind": "rendered", "text": "a"},
                                     "engine": {"kind": "rendered", "text": "b"}}}]}
    html = _causes("minijinja", section)
    assert "median reproducer: 62 template line(s), 1 message(s)" in html
    assert 'copy as command: <code class="command">chatgold render --cause c-1 --runner minijinja</code>' in html
    harness = dict(section, runner={"name": "mine", "protocol": 2}, expectations={"file": "ours/mine.json"})
    assert cause_command("c-1", harness) == ("chatgold render --cause c-1 --runner command:'<your harness>' "
                                            "--expectations ours")
    assert Report  # the module the writers share


# -- 6. only the selection; refusals apart ---------------------------------------------------------------------

def test_check_reports_properties_and_audit_of_the_selection_and_refusals_apart(tmp_path):
    done = chatgold("check", "--runner", _harness("--no-raise-exception"), "--template", "abacusai-smaug-mixtral-v0.1",
                    "--no-explain", "--no-attribution", "--expectations", tmp_path / "none", "--markdown",
                    tmp_path / "s.md", "--html", tmp_path / "r.html", "--json", tmp_path / "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "template properties of the 1 selected template(s)" in done.stdout
    assert "suite audit" not in done.stdout  # no revision pair has both its templates in this selection
    report = json.loads((tmp_path / "r.json").read_text())
    assert "audit" not in report
    counts = report["runners"]["lacking-jinja2"]["counts"]
    assert counts["raised-differently"] > 0
    markdown = (tmp_path / "s.md").read_text()
    head = next(line for line in markdown.splitlines() if line.startswith("| runner |"))
    row = next(line for line in markdown.splitlines() if line.startswith("| lacking-jinja2 |"))
    values = dict(zip([h.strip() for h in head.split("|")], [v.strip() for v in row.split("|")]))
    assert values["engine raised"] == str(counts.get("engine-raised", 0))
    assert values["raised differently"] == str(counts["raised-differently"])
    assert values["engine rendered"] == str(counts.get("engine-rendered", 0))
    html = (tmp_path / "r.html").read_text()
    assert "<th>engine raised</th><th>raised differently</th><th>engine rendered</th>" in html
    assert "refused differently" not in html + markdown


# -- 8. JUnit carries what a CI reader acts on, at a size bounded per cell -------------------------------------

def test_junit_size_is_bounded_per_cell_on_a_large_run(tmp_path):
    """A synthetic full gate: 11 engines x 903 templates x 95 cases (943,635 cells), 8% of cells known
    non-matches, 0.5% unexpected with a long description. JUnit: one case per engine x template (and per new
    cause), every cell counted in its template's case, a few bytes per cell."""
    import random
    import xml.etree.ElementTree as ET

    from conformance.report import Report
    from conformance.report.junit import CELL_TEXT, write_junit

    rng = random.Random(5)
    engines, templates, cases = 11, 903, [f"case-{i}" for i in range(95)]
    runners, cells = {}, []
    unexpected = 0
    for e in range(engines):
        name = f"engine-{e}"
        passed = {}
        for t in range(templates):
            template = f"template-{t:03d}"
            passed[template] = []
            for case in cases:
                roll = rng.random()
                if roll < 0.08:
                    cells.append({"runner": name, "template": template, "case": case, "status": "diverged",
                                  "verdict": "expected-fail", "expected": {"status": "diverged", "reason": "known"},
                                  "description": "d" * 400})
                elif roll < 0.085:
                    unexpected += 1
                    cells.append({"runner": name, "template": template, "case": case, "status": "diverged",
                                  "verdict": "unexpected-fail", "description": "x" * 5000, "cause": "c-new"})
                else:
                    passed[template].append(case)
        runners[name] = {"passed": passed, "causes": [{"id": "c-new", "title": "a new cause", "known": False,
                                                       "cells": [[c["template"], c["case"]] for c in cells
                                                                 if c["runner"] == name and c.get("cause")]}],
                         "stale_causes": []}
    report = Report({"runners": runners}, cells)
    path = write_junit(report, tmp_path / "junit.xml")
    size = path.stat().st_size
    total = engines * templates * len(cases)
    root = ET.parse(path).getroot()
    testcases = root.findall("testsuite/testcase")
    assert len(testcases) == engines * (templates + 1)
    assert sum(int(c.findtext("system-out").split(" cells:")[0]) for c in testcases
               if c.get("classname", "").count(".") == 1) == total
    # Bounds: a template's case costs a few hundred bytes, an unexpected cell at most its cut text and a line.
    assert size <= 400 * len(testcases) + (CELL_TEXT + 200) * unexpected
    assert size / total < 20, f"{size} bytes for {total} cells"


# -- 7. docs: counts computed, not typed -----------------------------------------------------------------------

def test_vectors_md_counts_are_the_corpus_counts():
    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.service.export import SCHEMA_ID, SEMANTICS

    templates, cases = len(load_corpus().entries), len(load_cases())
    text = (ROOT / "docs" / "vectors.md").read_text()
    full = re.search(r"full export \(([\d,]+) of ([\d,]+): (\d+) templates x (\d+) cases\)", text)
    assert full, "docs/vectors.md no longer states the full export's size"
    assert [int(g.replace(",", "")) for g in full.groups()] == [templates * cases] * 2 + [templates, cases]
    header = json.loads(re.search(r"```json\n(\{\"record\": \"header\".*?)\n```", text, re.S).group(1))
    assert header["cases"] == cases and header["cells"] == header["templates"] * cases
    assert header["schema"] == SCHEMA_ID and header["semantics"] == SEMANTICS
    flat = " ".join(text.split())
    assert "identifier, not an address" in flat and "`1.0` stays `1.0`" in flat


def test_author_docs_name_the_cache_the_build_string_and_the_runner_spec():
    text = (ROOT / "docs" / "engine-authors.md").read_text()
    assert "CHATGOLD_CACHE" in text and "~/.cache/chatgold" in text
    assert re.search(r"new `build`", text)
    assert "CHATGOLD_PROGRESS_INTERVAL" in text and "render --cause" in text
    assert "chatgold-expectations" in text


def test_a_moved_cell_says_which_cause_it_left_in_the_gates_message():
    from conformance.judge.expectations import Expectation, describe_cell
    from conformance.judge.status import CellResult, Status, Verdict

    result = CellResult("engine-x", "t", "c", Status.DIVERGED, cause="c-new", cause_title="now this")
    result.verdict = Verdict.CHANGED
    result.expectation = Expectation("diverged", "00", "the old reason", "", "c-old")
    assert "  its cause changed: the baseline filed it under c-old" in describe_cell(result)
    result.expectation = Expectation("diverged", None, "", "", "c-new", recorded_cause={"id": "c-old", "title": "then"})
    assert "  its cause changed: the baseline filed it under c-old then" in describe_cell(result)
    result.expectation = Expectation("diverged", None, "", "", "c-new")
    assert "its cause changed" not in describe_cell(result)
