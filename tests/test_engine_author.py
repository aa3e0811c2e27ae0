"""The engine author's path, proven from outside chatgold.

- A consumer of the exported vectors written from docs/vectors.md and runners/protocol/SEMANTICS.md alone, on
  plain jinja2 (runners/examples/vectors_jinja2.py), reaches every golden: run from a directory outside the
  checkout, with chatgold and transformers made unimportable.
- A consumer on the pinned @huggingface/jinja in node (runners/examples/vectors_hfjs.mjs) gives exactly the
  hfjs runner's status on every cell.
- A harness on plain jinja2 written from PROTOCOL.md + SEMANTICS.md (runners/examples/minimal_harness.py) gets
  no divergence through `chatgold check`; the JavaScript example harness passes `chatgold harness validate`, a
  harness that ignores the template fails it.
- An engine's baseline is recorded and checked from a directory outside the checkout.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "runners" / "examples"
PY_CONSUMER = ("plain_jinja2.py", "vectors_jinja2.py", "minimal_harness.py")
JS_CONSUMER = ("hfjs_engine.mjs", "vectors_hfjs.mjs", "harness.mjs")
# Rules a template can exercise, found by what its source says (SEMANTICS.md rule numbers).
RULE_PATTERNS = {
    "R16 generation": r"\{%-?\s*generation",
    "R15 loop controls": r"\{%-?\s*(break|continue)\s*-?%\}",
    "R17 tojson arguments": r"tojson\(\s*\w",
    "R19 strftime_now": r"strftime_now",
    "R18 raise_exception": r"raise_exception",
    "R11 reasoning aliases": r"reasoning_content|\.thinking\b",
    "R4 null keys": r"content is (not )?none|content is (not )?defined|tool_calls is defined",
    "R8 documents": r"\bdocuments\b",
    "R7 tools none": r"tools is (not )?none|tools is defined",
    "R20 dict": r"\bdict\(",
    "R6 bos_token": r"bos_token",
}
# Outside-consumer imports: the standard library, jinja2 and each other.
BLOCKED = ("conformance", "runners", "transformers", "tokenizers")
RUN_OUTSIDE = """
import os, runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in %r:
            raise ImportError(name + " is not available to an outside consumer")
sys.meta_path.insert(0, Blocked())
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
""" % (BLOCKED,)


def outside_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CHATGOLD"))}
    env["PATH"] = os.environ.get("PATH", "")
    return env


def copy_outside(tmp_path: Path, names) -> Path:
    """The example files alone, in a directory of their own outside the checkout, with run_outside.py."""
    where = tmp_path / "engine"
    where.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(EXAMPLES / name, where / name)
    (where / "run_outside.py").write_text(RUN_OUTSIDE)
    return where


def outside_argv(where: Path, script: str) -> list:
    # -E: no PYTHONPATH; -s: no user site; the blocker makes the installed chatgold and transformers unimportable.
    return [sys.executable, "-E", "-s", str(where / "run_outside.py"), str(where / script)]


def run_outside_python(where: Path, script: str, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(outside_argv(where, script) + [str(a) for a in args], cwd=where, env=outside_env(),
                          capture_output=True, text=True, timeout=timeout)


def chatgold(*args, timeout=900, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def rule_templates(per_rule: int = 2) -> dict:
    """{rule: [template ids]}: the first templates (by id) whose source exercises each rule."""
    from conformance.corpus.manifest import load_corpus

    entries = sorted(load_corpus().entries, key=lambda e: e.id)
    chosen = {}
    for rule, pattern in RULE_PATTERNS.items():
        regex = re.compile(pattern)
        chosen[rule] = [e.id for e in entries if regex.search(e.source())][:per_rule]
    return chosen


def selection_ids(sample: int = 0) -> list:
    ids = sorted({i for ids in rule_templates().values() for i in ids})
    if sample:
        from conformance.corpus.manifest import load_corpus

        rest = sorted(e.id for e in load_corpus().entries if e.id not in ids)
        ids += random.Random(16).sample(rest, sample)  # random, but the same every run
    return ids


def export(tmp_path: Path, template_ids, name="vectors.jsonl.gz") -> Path:
    out = tmp_path / name
    args = ["export", "--out", out]
    for template_id in template_ids:
        args += ["--template", template_id]
    done = chatgold(*args)
    assert done.returncode == 0, done.stderr
    return out


def semantics_vectors(path: Path) -> Path:
    """SEMANTICS.md's rule examples as a vectors file (each example was rendered by the reference in
    tests/test_semantics.py)."""
    from runners.base import Conversation
    from runners.semantics import examples

    lines = []
    for index, example in enumerate(examples()):
        conversation = Conversation.from_dict({k: v for k, v in example.items()
                                               if k in Conversation.FIELDS}).to_dict()
        if "expected" in example:
            text = example["expected"]
            expected = {"kind": "rendered", "text": text}
        else:
            raised = example["raised"]
            text = f"{raised['type']}: {raised['message']}"
            expected = {"kind": "raised", "text": text, "refusal": dict(raised)}
        data = text.encode("utf-8")
        expected.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        source = example["template"]
        lines.append({"record": "cell",
                      "template": {"id": f"semantics-{example['rule'].lower()}-{index}",
                                   "sha256": hashlib.sha256(source.encode()).hexdigest(), "source": source,
                                   "bos_token": example.get("bos_token"), "eos_token": example.get("eos_token")},
                      "case": {"id": f"example-{index}", **conversation}, "expected": expected})
    header = {"record": "header", "format": 2, "semantics": "runners/protocol/SEMANTICS.md",
              "reference": {"transformers": "5.24.0"}, "cells": len(lines), "templates": len(lines),
              "cases": len(lines), "bindings": False}
    with open(path, "w", encoding="utf-8") as handle:
        for record in [header, *lines]:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def read_statuses(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return {(r["template"], r["case"]): r["status"] for r in map(json.loads, handle)}


# -- the consumers use nothing of chatgold ---------------------------------------------------------------------

def test_the_python_examples_import_only_the_standard_library_jinja2_and_each_other():
    allowed = set(sys.stdlib_module_names) | {"jinja2", "plain_jinja2"}
    for name in PY_CONSUMER:
        tree = ast.parse((EXAMPLES / name).read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert imported <= allowed, (name, imported - allowed)


def test_the_javascript_examples_import_only_node_and_each_other():
    for name in JS_CONSUMER:
        text = (EXAMPLES / name).read_text(encoding="utf-8")
        specifiers = set(re.findall(r'^import .* from "([^"]+)";', text, re.M))
        assert specifiers and all(s.startswith("node:") or s == "./hfjs_engine.mjs" for s in specifiers), specifiers


def test_the_blocker_really_blocks(tmp_path):
    """The outside runs cannot fall back on the installed chatgold: a script importing it fails there."""
    where = copy_outside(tmp_path, ())
    (where / "peek.py").write_text("import conformance\n")
    done = run_outside_python(where, "peek.py")
    assert done.returncode != 0 and "not available to an outside consumer" in done.stderr


# -- the plain-jinja2 consumer, written from the docs, reaches every golden -------------------------------------

def test_docs_consumer_passes_every_rule_example(tmp_path):
    where = copy_outside(tmp_path, PY_CONSUMER)
    vectors = semantics_vectors(tmp_path / "semantics.jsonl")
    done = run_outside_python(where, "vectors_jinja2.py", vectors)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^(\d+)/\1 cells pass \(100\.00%\)", done.stdout, re.M), done.stdout


def test_docs_consumer_reaches_every_golden_on_templates_that_exercise_every_rule(tmp_path):
    chosen = rule_templates()
    assert all(len(ids) == 2 for ids in chosen.values()), chosen  # every rule has templates in the corpus
    vectors = export(tmp_path, selection_ids(sample=25))
    where = copy_outside(tmp_path, PY_CONSUMER)
    done = run_outside_python(where, "vectors_jinja2.py", vectors, "--statuses", tmp_path / "statuses.jsonl")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    statuses = read_statuses(tmp_path / "statuses.jsonl")
    with gzip.open(vectors, "rt", encoding="utf-8") as handle:
        header = json.loads(handle.readline())
    assert len(statuses) == header["cells"] > 3000
    assert set(statuses.values()) == {"match", "both-raised"}
    assert "100.00%" in done.stdout


# -- the node consumer on @huggingface/jinja agrees with the hfjs runner, cell by cell -----------------------------

@pytest.fixture(scope="module")
def hfjs_modules():
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH (scripts/setup.sh installs what the tests need)")
    from runners.hfjs import ensure_installed

    return ensure_installed()


def test_node_consumer_gives_the_hfjs_runners_verdicts(tmp_path, hfjs_modules):
    from conformance.checkrun import check_cells
    from conformance.judge.pipeline import GoldenJudge, Selection
    from runners.hfjs import HFJSRunner

    ids = selection_ids(sample=10)
    vectors = export(tmp_path, ids)
    where = copy_outside(tmp_path, JS_CONSUMER)
    done = subprocess.run(["node", str(where / "vectors_hfjs.mjs"), str(vectors), "--modules", hfjs_modules,
                           "--statuses", str(tmp_path / "statuses.jsonl"), "--show", "0"],
                          cwd=where, env=outside_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    consumer = read_statuses(tmp_path / "statuses.jsonl")
    selection = Selection.load(templates=ids)
    with HFJSRunner(workers=2) as runner:
        results = check_cells(runner, selection.cells(), GoldenJudge())
    chatgold_says = {r.key: str(r.status) for r in results.results}
    assert len(consumer) == len(chatgold_says) > 2000
    disagreements = {k: (consumer.get(k), v) for k, v in chatgold_says.items() if consumer.get(k) != v}
    assert not disagreements, list(disagreements.items())[:10]
    # Not a vacuous agreement: the engine diverges, refuses and skips on this selection.
    assert {"match", "diverged", "both-raised", "skipped"} <= set(chatgold_says.values())


# -- harnesses -----------------------------------------------------------------------------------------------------

def test_a_plain_jinja2_harness_from_the_docs_has_no_divergence(tmp_path):
    """minimal_harness.py, run from outside the checkout, through `chatgold check` on the rule selection."""
    where = copy_outside(tmp_path, PY_CONSUMER)
    argv = shlex.join(outside_argv(where, "minimal_harness.py"))
    args = ["check", "--runner", f"command:{argv}", "--expectations", tmp_path / "baselines", "--no-attribution",
            "--json", tmp_path / "report.json", "--timeout", "60"]
    for template_id in selection_ids(sample=10):
        args += ["--template", template_id]
    done = chatgold(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    (section,) = report["runners"].values()
    assert section["cells_total"] > 2000
    assert {k for k, v in section["counts"].items() if v} <= {"match", "both-raised"}, section["counts"]
    assert section["conformance"] == 100.0


def _validate(*argv, timeout=120, env=None):
    return chatgold("harness", "validate", "--timeout", "10", "--start-timeout", "30", "--", *argv,
                    timeout=timeout, env=env)


def test_validate_passes_the_example_harnesses_and_fails_one_that_ignores_the_template(hfjs_modules):
    env = dict(os.environ, HFJS_NODE_MODULES=hfjs_modules)
    outputs = {}
    for label, argv in (("js", ["node", EXAMPLES / "harness.mjs"]),
                        ("js-bindings", ["node", EXAMPLES / "harness.mjs", "--bindings"]),
                        ("minimal", [sys.executable, EXAMPLES / "minimal_harness.py"])):
        done = _validate(*argv, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "conforms" in done.stdout and "ok   batch" in done.stdout
        outputs[label] = done.stdout
    # transformers.js keeps null keys; with the reference's bindings, @huggingface/jinja gets them right.
    assert "DIFF null-keys-dropped" in outputs["js"] and "ok   null-keys-dropped" in outputs["js-bindings"]
    assert "DIFF" not in outputs["minimal"] and "SKIP" not in outputs["minimal"]
    done = _validate(sys.executable, ROOT / "tests" / "harnesses" / "ignores_template.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL template-sensitivity" in done.stdout and "does NOT conform" in done.stdout


def test_validate_usage_errors_exit_2():
    done = chatgold("harness", "validate", "--timeout", "5")
    assert done.returncode == 2 and "harness command line" in done.stderr


# -- an engine's own baseline, outside the checkout ------------------------------------------------------------

def _tree_digest(*folders) -> str:
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


def test_an_engine_baseline_lives_in_the_engines_repository(tmp_path, hfjs_modules):
    engine_repo = tmp_path / "engine-repo"
    where = copy_outside(engine_repo, JS_CONSUMER)
    baselines = engine_repo / "chatgold-expectations"
    env = dict(os.environ, HFJS_NODE_MODULES=hfjs_modules)
    runner = f"command:node {where / 'harness.mjs'}"
    selection = ["--template", "meta-llama-llama-3.1-8b-instruct", "--template", "unsloth-qwen3-8b",
                 "--case", "chat-*", "--case", "tool-*", "--case", "reasoning-*"]
    before = _tree_digest(ROOT / "conformance" / "expectations", ROOT / "goldens")
    first = chatgold("check", "--runner", runner, "--expectations", baselines, "--no-attribution", *selection,
                     cwd=engine_repo, env=env)
    assert first.returncode == 1, first.stdout[-2000:]  # no baseline yet: its divergences are news
    update = chatgold("expectations", "update", "--runner", runner, "--expectations", baselines, *selection,
                      cwd=engine_repo, env=env)
    assert update.returncode == 0, update.stdout + update.stderr
    (baseline,) = baselines.iterdir()
    assert baseline.name == "hfjs-example.json" and json.loads(baseline.read_text())
    again = chatgold("check", "--runner", runner, "--expectations", baselines, "--no-attribution", *selection,
                     cwd=engine_repo, env=env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert _tree_digest(ROOT / "conformance" / "expectations", ROOT / "goldens") == before
