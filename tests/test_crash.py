"""Crash injection: an engine process killed mid-run costs the cells in flight (Errored), nothing else;
a `chatgold goldens update` killed midway leaves every golden old or new, never partial."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from runners import Errored, Rendered, RenderRequest, get_runner

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "hello"}]
# One template for every cell, so an engine that keeps a server per template reuses it. It is slow only for
# the message "slowdown" (long enough in every engine for a kill to land mid-render): llama-server renders
# the template once at start-up with its own messages, which must stay fast.
TEMPLATE = ("{% if messages[0].content == 'slowdown' %}{% for i in range(3000) %}{% for j in range(3000) %}"
            "{% endfor %}{% endfor %}{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")


def _requests() -> list[RenderRequest]:
    normal = [RenderRequest.make(template=TEMPLATE, messages=MESSAGES, template_id=f"n{i}", case_id="c") for i in range(6)]
    slow = RenderRequest.make(template=TEMPLATE, messages=[{"role": "user", "content": "slowdown"}], template_id="slow",
                         case_id="c")
    return normal[:3] + [slow] + normal[3:]


def _kill_when(pids_of, ready: threading.Event, killed: list) -> threading.Thread:
    """Once `ready` is set (the slow cell is in flight), SIGKILL every engine process of the runner."""
    def run():
        ready.wait(120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = pids_of()
            if pids:
                time.sleep(0.3)
                for pid in pids_of():
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.05)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _run_and_kill(runner, pids_of) -> list:
    requests = _requests()
    ready, killed = threading.Event(), []
    killer = _kill_when(pids_of, ready, killed)
    outcomes = []
    try:
        for index, request in enumerate(requests):
            if request.template_id == "slow":
                ready.set()
            outcomes.append(runner.render(request))
    finally:
        runner.close()
    killer.join(5)
    assert killed, "no engine process was running to kill"
    assert len(outcomes) == len(requests)
    for request, outcome in zip(requests, outcomes):
        if request.template_id == "slow":
            assert isinstance(outcome, Errored), f"the cell in flight when the engine died: {outcome!r}"
        else:
            assert outcome == Rendered("[user]hello"), f"{request.template_id} was lost: {outcome!r}"
    return outcomes


def test_kill_node_harness_mid_run():
    runner = get_runner("hfjs", timeout=60)

    def pids():
        return [p.proc.pid for p in list(runner._all) if p.alive()]

    _run_and_kill(runner, pids)


def test_kill_llama_server_mid_run():
    from runners.llamacpp import build

    if build.find_llama_server() is None:
        build.build_llama_server()   # the real build (cached under ~/.cache/chatgold), never a skip
    runner = get_runner("llamacpp", timeout=60, workers=1)

    def pids():
        return [s.proc.pid for s in list(runner._busy) if s.alive()]

    _run_and_kill(runner, pids)


# --- goldens update killed midway -----------------------------------------------------------------------

TEMPLATES = ["ollama-chatml-9", "meta-llama-llama-3.1-8b-instruct", "qwen-qwen2.5-7b-instruct",
             "mistralai-mistral-7b-instruct-v0.3"]
OLD = b"OLD GOLDEN: the update had not reached this cell\n"


def _sandbox(tmp_path: Path, templates: list[str]) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "templates", root / "templates")
    (root / "goldens").mkdir(parents=True)
    shutil.copy(ROOT / "goldens" / "_meta.json", root / "goldens" / "_meta.json")
    for template_id in templates:
        shutil.copytree(ROOT / "goldens" / template_id, root / "goldens" / template_id)
    return root


def test_kill_goldens_update_midway(tmp_path):
    from conformance.corpus.manifest import load_corpus

    known = {e.id for e in load_corpus().entries}
    templates = [t for t in TEMPLATES if t in known]
    assert len(templates) >= 3, f"expected corpus templates missing: {set(TEMPLATES) - known}"
    root = _sandbox(tmp_path, templates)
    new, files = {}, []
    for template_id in templates:
        for path in sorted((root / "goldens" / template_id).glob("*.txt")):
            new[path] = path.read_bytes()
            path.write_bytes(OLD)
            files.append(path)
    env = {**os.environ, "CHATGOLD_ROOT": str(root), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "conformance.cli", "goldens", "update", "--workers", "1"]
    for template_id in templates:
        argv += ["--template", template_id]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # Kill once some, not all, goldens were rewritten.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            rewritten = sum(1 for p in files if p.read_bytes() != OLD)
            if rewritten >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"update finished before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    states = {"old": 0, "new": 0}
    for path in files:
        data = path.read_bytes()
        assert data in (OLD, new[path]), f"{path.name}: partial golden after the kill ({len(data)} bytes)"
        states["old" if data == OLD else "new"] += 1
    assert states["new"] >= 1 and states["old"] >= 1, states
    # Anything else left in the golden tree (an interrupted write's temp file) is caught by the orphan check.
    from conformance.corpus.cases import load_cases
    from conformance.judge.goldens import CAPABILITIES_FILE, PROPERTIES_FILE, find_orphans

    leftovers = [p for d in templates for p in (root / "goldens" / d).iterdir()
                 if p not in new and p.name not in (CAPABILITIES_FILE, PROPERTIES_FILE)]
    orphans = set(find_orphans([e.id for e in load_corpus().entries], [c.id for c in load_cases()], root / "goldens"))
    assert all(p in orphans for p in leftovers), f"stray files the orphan check misses: {leftovers}"
    print(f"\ngoldens update killed midway: {states['new']} new, {states['old']} old, "
          f"{len(leftovers)} stray file(s), all caught by the orphan check")
