"""Every engine process's memory is capped (issue 32 item 5): the reference (hf) and the Python harnesses by
address space, node (hfjs) by its heap and data segment, command: harnesses by a documented default data cap
(CHATGOLD_HARNESS_MEMORY_MB); a template or harness that allocates without end is a clean Errored cell, named
out of memory, not a process of GBs; and a harness's response line is capped well below what would let a
worker reach GBs."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from runners.base import Errored, Rendered, RenderRequest
from runners.command import DEFAULT_HARNESS_MEMORY, MAX_LINE, CommandRunner

BROKEN = Path(__file__).resolve().parent / "harnesses" / "broken.py"


def _limit(pid: int, name: str) -> int:
    """A process's soft limit, from /proc/PID/limits ("Max data size", "Max address space")."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith(name):
                value = line[len(name):].split()[0]
                return -1 if value == "unlimited" else int(value)
    raise AssertionError(name)


def _request(template: str) -> RenderRequest:
    return RenderRequest.make(template, [{"role": "user", "content": "hi"}])


def test_hf_refuses_a_memory_hungry_template_cleanly():
    from runners.hf import HF_MEMORY_LIMIT, HFRunner

    with HFRunner(timeout=20) as runner:
        # 1.5 GB in one string: within the old 4 GiB cap, over the reference's 1 GiB.
        outcome = runner.render(_request("{% set s = 'x' * 1500000000 %}{{ s|length }}"))
        assert isinstance(outcome, Errored) and "memory" in outcome.message and not outcome.timed_out
        pid = runner._all[-1].proc.pid
        assert 0 < _limit(pid, "Max address space") <= HF_MEMORY_LIMIT
        assert runner.render(_request("{{ messages[0].content }}")) == Rendered("hi")


@pytest.mark.skipif(shutil.which("node") is None, reason="hfjs needs node")
def test_hfjs_refuses_a_memory_hungry_template_cleanly():
    from runners.hfjs import NODE_MEMORY_LIMIT, HFJSRunner

    with HFJSRunner(timeout=60) as runner:
        assert runner.render(_request("{{ messages[0].content }}")) == Rendered("hi")
        assert 0 < _limit(runner._all[-1].proc.pid, "Max data size") <= NODE_MEMORY_LIMIT
        outcome = runner.render(_request("{% for i in range(10000000000) %}{% endfor %}"))
        assert isinstance(outcome, Errored) and "out of memory" in outcome.message and not outcome.timed_out
        assert runner.render(_request("{{ messages[0].content }}")) == Rendered("hi")


def test_minijinja_harness_is_capped_as_the_evaluator():
    from runners import get_runner
    from runners.evaluator.runner import EVALUATOR_MEMORY_LIMIT

    runner = get_runner("minijinja")
    try:
        assert runner.render(_request("{{ messages[0].content }}")) == Rendered("hi")
        assert 0 < _limit(runner._all[-1].proc.pid, "Max address space") <= EVALUATOR_MEMORY_LIMIT
    finally:
        runner.close()


def test_command_harnesses_get_a_default_data_cap_and_the_variable_sets_it(monkeypatch):
    with CommandRunner([sys.executable, str(BROKEN), "allocate"]) as runner:
        assert runner.render(_request("fine")) == Rendered("fine")
        assert _limit(runner._all[-1].proc.pid, "Max data size") == DEFAULT_HARNESS_MEMORY
    monkeypatch.setenv("CHATGOLD_HARNESS_MEMORY_MB", "300")
    with CommandRunner([sys.executable, str(BROKEN), "allocate"]) as runner:
        outcome = runner.render(_request("BREAK"))
        assert isinstance(outcome, Errored) and "out of memory" in outcome.message, outcome
        assert runner.render(_request("fine")) == Rendered("fine")
    monkeypatch.setenv("CHATGOLD_HARNESS_MEMORY_MB", "lots")
    with pytest.raises(ValueError, match="CHATGOLD_HARNESS_MEMORY_MB"):
        CommandRunner([sys.executable, str(BROKEN), "ok"])


def test_a_response_line_is_capped_well_below_gigabytes():
    assert MAX_LINE <= 32 * 1024 * 1024
    with CommandRunner([sys.executable, str(BROKEN), "hugeline"]) as runner:
        outcome = runner.render(_request("BREAK"))
        assert isinstance(outcome, Errored) and "response line longer" in outcome.message
        assert runner.render(_request("fine")) == Rendered("fine")
