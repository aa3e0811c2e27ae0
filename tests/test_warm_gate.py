"""A warm gate (every outcome in the result store) gives the verdicts, causes and report of a cold one, and derives
nothing again that the store holds: the property records' renders (all but the determinism check's repeat), each
known cause's reproducer on both sides (unless --chatgold-reconfirm-causes), and token-parity verdicts (issue 33).
Real engines (MiniJinja, the evaluator, the reference; llama-server for tokens) and a temporary store."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# MiniJinja's baseline holds three causes over this template's cells in these cases
# (conformance/expectations/minijinja.json); two cases it renders as the reference does.
TEMPLATES = ["meta-llama-llama-3.1-8b-instruct"]
CASES = ["tool-result-json-text", "tools-no-parameters", "tools-number-edges", "wire-reasoning-only-null",
         "chat-single-user", "chat-multi-turn"]
RUNNERS = ["minijinja", "evaluator"]


def _gate(tmp_path: Path, report: str, *extra) -> subprocess.CompletedProcess:
    from importlib.metadata import entry_points

    plugin = [] if any(e.name == "chatgold" for e in entry_points(group="pytest11")) else ["-p", "conformance.gate.plugin"]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-q", "--pyargs", "conformance.gate",
            "--chatgold-workers", "1", f"--chatgold-report={tmp_path / report}",
            f"--chatgold-timings={tmp_path / f'{report}.timings.json'}", *extra]
    for runner in RUNNERS:
        argv += ["--chatgold-runner", runner]
    for template in TEMPLATES:
        argv += ["--chatgold-template", template]
    for case in CASES:
        argv += ["--chatgold-case", case]
    env = dict(os.environ, PYTHONPATH=str(REPO), CHATGOLD_ROOT=str(REPO), CHATGOLD_RESULTS_DIR=str(tmp_path / "store"))
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def _report(tmp_path: Path, report: str) -> dict:
    """report.json without what measures the run rather than judges it (times, the generation date)."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "generated" and not k.endswith("seconds")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads((tmp_path / report / "report.json").read_text(encoding="utf-8")))


def _cells(tmp_path: Path, report: str) -> list:
    import gzip

    with gzip.open(tmp_path / report / "report.cells.jsonl.gz", "rt", encoding="utf-8") as handle:
        return sorted(handle)


def _store_line(done: subprocess.CompletedProcess) -> tuple:
    found = re.search(r"result store .*?: (\d+) cells reused, (\d+) rendered", done.stdout)
    assert found, done.stdout
    return int(found.group(1)), int(found.group(2))


def _touched_causes() -> list:
    """MiniJinja's known causes whose cells these templates hold, with their reproducers' requests."""
    from conformance.explain.baseline import _repro_request
    from conformance.judge.expectations import load_expectations

    baseline = load_expectations("minijinja")
    ids = {e.cause for t in TEMPLATES for case in CASES for e in [baseline.get(t, case)] if e is not None and e.cause}
    return [(cause_id, _repro_request(baseline.causes[cause_id].repro)) for cause_id in sorted(ids)]


GC_PROBE = """
import gc, json, pathlib
seen = {}
def pytest_configure(config):
    seen["before"] = gc.get_threshold()
def pytest_runtest_call(item):
    seen.setdefault("during", []).append(gc.get_threshold())
def pytest_unconfigure(config):
    seen["after"] = gc.get_threshold()
    pathlib.Path("gc-thresholds.json").write_text(json.dumps(seen))
"""


def test_a_warm_gate_gives_the_cold_gates_verdicts_causes_and_report_and_derives_nothing_again(tmp_path):
    from conformance.collector import CHECK_THRESHOLDS

    (tmp_path / "gcprobe.py").write_text(GC_PROBE)  # on the path: the gate runs as `python -m pytest` from here
    cold = _gate(tmp_path, "cold", "-p", "gcprobe")
    assert cold.returncode == 0, cold.stdout[-3000:] + cold.stderr[-3000:]
    # The collector keeps to young objects while the session runs, and is as it was once the report is written.
    thresholds = json.loads((tmp_path / "gc-thresholds.json").read_text())
    assert list(CHECK_THRESHOLDS) in thresholds["during"]
    assert thresholds["before"] == thresholds["after"] != list(CHECK_THRESHOLDS)
    warm = _gate(tmp_path, "warm")
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    assert _store_line(cold)[1] > 0
    reused, rendered = _store_line(warm)
    assert reused > 0 and rendered == 0, warm.stdout
    assert _report(tmp_path, "warm") == _report(tmp_path, "cold")
    assert _cells(tmp_path, "warm") == _cells(tmp_path, "cold")
    causes = _report(tmp_path, "cold")["runners"]["minijinja"]["causes"]
    assert causes, "the selection is chosen to hold MiniJinja causes"

    # The store holds what a warm run would otherwise derive again.
    from conformance.analysis.properties import property_requests
    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.render.store import ResultStore, request_key
    from runners import REFERENCE_RUNNER, get_runner

    store = ResultStore(tmp_path / "store", verbose=False)
    reference, engine = get_runner(REFERENCE_RUNNER), get_runner("minijinja")
    try:
        ref_id, eng_id = store.identity_of(reference)[0], store.identity_of(engine)[0]
        corpus, cases = load_corpus(), load_cases()
        for template_id in TEMPLATES:
            entry = corpus.get(template_id)
            pairs = property_requests(entry.source(), entry.bos_token, entry.eos_token, cases, template_id)
            wanted = [request_key(r) for (kind, _), r in pairs if kind in ("clock", "flip", "probe")]
            held = [store.lookup(ref_id, [r])[0] for (kind, _), r in pairs if kind in ("clock", "flip", "probe")]
            assert wanted and all(outcome is not None for outcome in held), template_id
        touched = _touched_causes()
        assert touched
        for cause_id, request in touched:
            assert store.lookup(ref_id, [request])[0] is not None, cause_id
            assert store.lookup(eng_id, [request])[0] is not None, cause_id
    finally:
        reference.close()
        engine.close()

    # The scheduled run's option renders every touched cause's reproducer again, on both sides, with the same report.
    forced = _gate(tmp_path, "reconfirm", "--chatgold-reconfirm-causes")
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert _store_line(forced)[1] == 2 * len(touched), forced.stdout
    assert _report(tmp_path, "reconfirm") == _report(tmp_path, "cold")
    timings = json.loads((tmp_path / "warm.timings.json").read_text())
    assert {"render", "judge", "explain", "properties", "report"} <= set(timings["by_stage"])


def test_token_parity_verdicts_are_stored_under_the_engines_and_the_tokenizers_identity(tmp_path):
    from conformance.checkrun import check_cells
    from conformance.judge.pipeline import Selection
    from conformance.render.store import ResultStore
    from runners import get_runner

    # Gemma 2: BOS, EOS and both flags known from evidence, so every rendered cell gets a token verdict.
    from conformance.judge.goldens import GoldenStore

    goldens = GoldenStore()
    cells = [c for c in Selection.load(["google-gemma-2-2b-it"], ["chat-*"]).cells()
             if not goldens(c.template.id, c.case.id).raised][:3]  # cases the reference renders (no system turn)
    assert len(cells) == 3

    def run(refresh: bool = False) -> tuple:
        store = ResultStore(tmp_path / "store", verbose=False)
        runner = get_runner("llamacpp", workers=1)
        try:
            results = check_cells(runner, cells, store=store, refresh=refresh)
        finally:
            runner.close()
        return [r.tokens for r in results.results], store.counters

    cold, cold_counters = run()
    assert all(t and t["status"] not in ("unknown", "not-compared") for t in cold), cold
    asked = cold_counters.tokens_asked
    assert asked == len(cells) and cold_counters.tokens_reused == 0
    warm, warm_counters = run()
    assert warm == cold
    assert warm_counters.tokens_asked == 0 and warm_counters.tokens_reused == asked
    fresh, fresh_counters = run(refresh=True)  # --chatgold-no-cache asks the engine again
    assert fresh == cold and fresh_counters.tokens_asked == asked


def test_a_report_folder_given_apart_cannot_move_the_rootdir(tmp_path):
    """pytest finds its rootdir before plugins add their options, so `--chatgold-report DIR` with DIR an existing
    folder outside the checkout made DIR the rootdir: the checkout's settings were lost and its tests' session
    fixture (a private result store) applied to the gate, which then rendered every cell again. The gate refuses
    that with the fix in its message; the `=` spelling keeps the checkout's rootdir."""
    from importlib.metadata import entry_points

    plugin = [] if any(e.name == "chatgold" for e in entry_points(group="pytest11")) else ["-p", "conformance.gate.plugin"]
    existing = tmp_path / "reports"
    existing.mkdir()
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "--co", "--pyargs", "conformance.gate",
            "--chatgold-runner", "minijinja", "--chatgold-template", TEMPLATES[0]]
    env = dict(os.environ, PYTHONPATH=str(REPO), CHATGOLD_ROOT=str(REPO), CHATGOLD_RESULTS_DIR=str(tmp_path / "store"))
    apart = subprocess.run(base + ["--chatgold-report", str(existing)], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=300)
    assert apart.returncode == 4, apart.stdout + apart.stderr
    assert f"--chatgold-report={existing}" in apart.stderr
    joined = subprocess.run(base + [f"--chatgold-report={existing}"], capture_output=True, text=True, env=env,
                            cwd=REPO, timeout=300)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert f"rootdir: {REPO}" in joined.stdout
