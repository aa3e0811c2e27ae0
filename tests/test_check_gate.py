"""The pytest gate (`pytest --pyargs conformance.gate`) and `chatgold check` against a baseline: pass with
the recorded baseline, fail readably when the baseline disagrees. Real minijinja, real goldens; the
baseline lives in a temporary directory (CHATGOLD_EXPECTATIONS_DIR)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = "ai21labs-ai21-jamba-reasoning-3b"
CASES = ["tools-no-parameters", "chat-single-user"]   # a tojson divergence and a match, for minijinja
DIVERGED_CASE = "tools-no-parameters"


REPO = Path(__file__).resolve().parent.parent


def _run(argv, env, cwd):
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _plugin_args():
    """Load the gate plugin explicitly unless the installed package registers it (entry point `chatgold`)."""
    from importlib.metadata import entry_points

    installed = any(e.name == "chatgold" for e in entry_points(group="pytest11"))
    return [] if installed else ["-p", "conformance.gate.plugin"]


@pytest.fixture()
def baseline(tmp_path):
    env = dict(os.environ, CHATGOLD_EXPECTATIONS_DIR=str(tmp_path / "expectations"))
    selection = ["--template", TEMPLATE] + [x for c in CASES for x in ("--case", c)]
    done = _run([sys.executable, "-m", "conformance.cli", "expectations", "update", "--runner", "minijinja",
                 "--workers", "1", *selection], env, tmp_path)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "expectations" / "minijinja.json"
    data = json.loads(path.read_text())
    assert list(data["cells"][TEMPLATE]) == [DIVERGED_CASE]
    assert data["cells"][TEMPLATE][DIVERGED_CASE].startswith("diverged:")
    # format 2: the cell names its root cause, recorded once with its reproducer
    cause = data["cells"][TEMPLATE][DIVERGED_CASE].partition("@")[2]
    assert [c["id"] for c in data["causes"]] == [cause] and "tojson" in data["causes"][0]["repro"]["template"]
    return env, path, data


def _gate(env, cwd, report_dir=None, explain=True):
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(), "-q", "--pyargs", "conformance.gate",
            "-k", "test_engine_matches_expectations", "--chatgold-runner", "minijinja", "--chatgold-workers", "1",
            "--chatgold-template", TEMPLATE] + [x for c in CASES for x in ("--chatgold-case", c)]
    if report_dir:
        argv += [f"--chatgold-report={report_dir}"]
    if not explain:
        argv.append("--chatgold-no-explain")
    return _run(argv, env, cwd)


def test_gate_passes_with_the_baseline_and_fails_readably_when_it_disagrees(baseline, tmp_path):
    env, path, data = baseline
    done = _gate(env, tmp_path, tmp_path / "reports")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    report = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert report["unexpected"] == 0
    # Attribution happens once at report time for every runner's diverged cells: the known tojson
    # divergence is blamed on the tojson filter.
    assert report["runners"]["minijinja"]["blamed_constructs"] == {"filter:tojson": 1}

    # A baseline whose recorded output differs from the engine's: without explaining, the known divergence
    # "changed"; explained, its root cause is the known one, so it is known.
    data["cells"][TEMPLATE][DIVERGED_CASE] = "diverged:0000000000000000"
    data["rules"] = [{"template": TEMPLATE, "reason": "minijinja's tojson escapes apostrophes"}]
    path.write_text(json.dumps(data))
    done = _gate(env, tmp_path, explain=False)
    assert done.returncode == 1
    assert f"minijinja {TEMPLATE} x {DIVERGED_CASE}: diverged (expected diverged with fingerprint 0000000000000000" in done.stdout
    assert "first difference at byte" in done.stdout
    assert "(filter:tojson)" in done.stdout
    assert "expectation's reason: minijinja's tojson escapes apostrophes" in done.stdout
    done = _gate(env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    # No baseline entry and no known cause: a new root cause, news.
    data["cells"], data["causes"] = {}, []
    path.write_text(json.dumps(data))
    done = _gate(env, tmp_path)
    assert done.returncode == 1
    assert "not in the expectations: a new divergence" in done.stdout
    assert "root cause c-" in done.stdout and "(new)" in done.stdout and "minimal reproducer:" in done.stdout
    # The gate's terminal summary names the change by cause.
    assert "chatgold minijinja:\n    causes: 1 new, 0 fixed, 0 cells moved to another cause\n      NEW   c-" in done.stdout


def test_check_cli_exit_status_follows_the_baseline(baseline, tmp_path):
    env, path, data = baseline
    argv = [sys.executable, "-m", "conformance.cli", "check", "--runner", "minijinja", "--workers", "1",
            "--template", TEMPLATE] + [x for c in CASES for x in ("--case", c)]
    done = _run(argv, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unexpected outcomes: 0" in done.stdout
    data["cells"][TEMPLATE][DIVERGED_CASE] = "engine-raised"
    path.write_text(json.dumps(data))
    done = _run(argv + ["--no-explain"], env, tmp_path)
    assert done.returncode == 1
    assert f"UNEXPECTED {TEMPLATE} x {DIVERGED_CASE}: diverged (expected engine-raised)" in done.stdout
    # Explained, the cell's root cause is the baseline's known cause: known, whatever status the file says.
    done = _run(argv, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
