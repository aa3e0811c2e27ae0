"""The GitHub Actions workflows lint clean, and the example engine caller's harness command really runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
ENGINE_CHECK = ROOT / ".github" / "scripts" / "engine_check.py"


def actionlint() -> str:
    # Installed from the test extra's wheel, which carries the binary (no download at install or run time).
    path = shutil.which("actionlint")
    assert path, "actionlint is not on PATH: install the project's test extra (pip install -e .[test])"
    return path


def test_actionlint_is_a_real_binary():
    version = subprocess.run([actionlint(), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert "actionlint" in version.stdout


def test_workflows_pass_actionlint():
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert {"conformance.yml", "engine-conformance.yml", "example-engine.yml"} <= {Path(f).name for f in files}
    lint = subprocess.run([actionlint(), "-no-color", *files], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The lint can fail: a caller passing an input the reusable workflow does not declare is reported."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)  # actionlint finds workflows from the repository root
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOWS / "engine-conformance.yml", repo / ".github" / "workflows")
    caller = yaml.safe_load((WORKFLOWS / "example-engine.yml").read_text())
    caller.pop(True, None)  # YAML 1.1 reads the `on:` key as True
    caller["on"] = {"push": None}
    caller["jobs"]["chatgold"]["with"]["harness-comand"] = "typo"
    (repo / ".github" / "workflows" / "caller.yml").write_text(yaml.safe_dump(caller))
    lint = subprocess.run([actionlint(), "-no-color"], capture_output=True, text=True, timeout=120, cwd=repo)
    assert lint.returncode != 0
    assert "harness-comand" in lint.stdout


def _example_inputs() -> dict:
    caller = yaml.safe_load((WORKFLOWS / "example-engine.yml").read_text())
    job = caller["jobs"]["chatgold"]
    assert job["uses"] == "./.github/workflows/engine-conformance.yml"
    return job["with"]


def _engine_check(tmp_path, harness: str, templates: str, cases: str, expectations=None):
    """Run the reusable workflow's check step as the workflow does: env inputs, engine checkout as cwd."""
    reports = tmp_path / "reports"
    env = {**os.environ, "HARNESS_COMMAND": harness, "TEMPLATES": templates, "CASES": cases,
           "CHATGOLD_ROOT": str(ROOT), "PYTHONPATH": str(ROOT)}
    if expectations is not None:
        env["EXPECTATIONS_DIR"] = str(expectations)
    done = subprocess.run([sys.executable, str(ENGINE_CHECK), "--reports", str(reports)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, reports


def test_example_caller_harness_runs_and_passes(tmp_path):
    inputs = _example_inputs()
    harness = inputs["harness-command"]
    assert (ROOT / harness.split()[1]).exists()
    done, reports = _engine_check(tmp_path, harness.replace("python ", f"{sys.executable} ", 1),
                                  inputs["templates"], inputs["cases"])
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((reports / "report.json").read_text())
    (section,) = report["runners"].values()
    expected = len(inputs["templates"].split()) * len(inputs["cases"].split())
    assert section["cells_total"] == expected and section["counts"]["match"] > 0
    (badge_file,) = (reports / "badges").iterdir()
    badge = json.loads(badge_file.read_text())
    assert badge["schemaVersion"] == 1 and badge["message"].startswith(f"{section['conformance']:.2f}%")
    assert (reports / "summary.md").read_text().strip() and (reports / "report.html").exists()


def test_engine_check_fails_a_diverging_engine(tmp_path):
    """The same step gates a PR: an engine with no baseline that diverges exits 1."""
    harness = f"{sys.executable} runners/examples/chatml_builtin.py"
    empty_baselines = tmp_path / "expectations"
    empty_baselines.mkdir()
    done, reports = _engine_check(tmp_path, harness, "meta-llama-llama-3.1-8b-instruct", "chat-system",
                                  expectations=empty_baselines)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((reports / "report.json").read_text())
    (section,) = report["runners"].values()
    assert section["counts"]["diverged"] == 1
    assert "diverged" in (reports / "summary.md").read_text()


def test_engine_check_rejects_an_empty_harness(tmp_path):
    done, _ = _engine_check(tmp_path, "  ", "", "")
    assert done.returncode == 2 and "HARNESS_COMMAND" in done.stderr


def test_release_vectors_step_writes_the_assets(tmp_path):
    """The release job's step: the vectors, their sha256 (sha256sum format) and the reference versions."""
    import gzip
    import hashlib

    done = subprocess.run([sys.executable, str(ROOT / ".github" / "scripts" / "release_vectors.py"), "--out",
                           str(tmp_path), "--template", "01-ai-yi-1.5-9b-chat", "--case", "chat-*"], cwd=ROOT,
                          env={**os.environ, "CHATGOLD_ROOT": str(ROOT), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    data = (tmp_path / "vectors.jsonl.gz").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert (tmp_path / "vectors.jsonl.gz.sha256").read_text() == f"{digest}  vectors.jsonl.gz\n"
    reference = json.loads((tmp_path / "vectors.reference.json").read_text())
    header = json.loads(gzip.decompress(data).split(b"\n")[0])
    assert reference["sha256"] == digest and reference["reference"] == header["reference"]
    assert reference["reference"]["transformers"] == "5.24.0" and reference["cells"] == header["cells"] > 0
    assert digest in (tmp_path / "release-notes.md").read_text()
    workflow = yaml.safe_load((WORKFLOWS / "release-vectors.yml").read_text())
    steps = [step.get("run", "") for step in workflow["jobs"]["vectors"]["steps"]]
    assert any("release_vectors.py --out dist" in run for run in steps)
    assert any("vectors.jsonl.gz.sha256" in run and "vectors.reference.json" in run for run in steps)


def test_site_workflow_publishes_the_scheduled_runs_report():
    """site.yml builds `chatgold site` from the scheduled conformance run's merged report and deploys it to Pages;
    the shards upload the report's sidecar too, without which neither the merge nor the site can read it."""
    site = yaml.safe_load((WORKFLOWS / "site.yml").read_text())
    trigger = site[True]  # YAML 1.1 reads the `on:` key as True
    assert trigger["workflow_run"]["workflows"] == ["conformance"]
    build, deploy = site["jobs"]["build"], site["jobs"]["deploy"]
    assert "github.event.workflow_run.event == 'schedule'" in build["if"]
    steps = {step.get("uses", step.get("run", "")).split("@")[0]: step for step in build["steps"]}
    assert steps["actions/download-artifact"]["with"]["name"] == "conformance-report"
    assert any(run.startswith("chatgold site reports/report.json --out site") for run in steps)
    assert steps["actions/upload-pages-artifact"]["with"]["path"] == "site"
    assert deploy["needs"] == "build" and deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    gate = yaml.safe_load((WORKFLOWS / "conformance.yml").read_text())
    upload = next(s for s in gate["jobs"]["gate"]["steps"] if s.get("name") == "Upload shard report")
    assert set(upload["with"]["path"].split()) == {"reports/report.json", "reports/report.cells.jsonl.gz"}


def test_the_baseline_recording_workflow_records_shards_and_merges_them():
    """record-baseline.yml: a matrix of `expectations update --shard I/N` jobs, then one `expectations merge`
    given every shard's recording (the options it passes are the CLI's own)."""
    from conformance.cli import build_parser

    flow = yaml.safe_load((WORKFLOWS / "record-baseline.yml").read_text())
    record, merge = flow["jobs"]["record"], flow["jobs"]["merge"]
    assert "fromJSON(needs.plan.outputs.shards)" in record["strategy"]["matrix"]["shard"]
    recording = next(s for s in record["steps"] if s.get("name") == "Record")
    assert "expectations update" in recording["run"] and '--shard "$SHARD"' in recording["run"]
    assert recording["env"]["SHARD"] == "${{ matrix.shard }}/${{ inputs.shards }}"
    assert merge["needs"] == "record"
    merging = next(s for s in merge["steps"] if s.get("name") == "Merge")
    assert "expectations merge" in merging["run"] and '--part "$i/$SHARDS"' in merging["run"]
    args = build_parser().parse_args(["expectations", "merge", "--runner", "llamacpp", "--expectations", "out",
                                      "--part", "1/2", "a", "--part", "2/2", "b"])
    assert args.part == [["1/2", "a"], ["2/2", "b"]]
