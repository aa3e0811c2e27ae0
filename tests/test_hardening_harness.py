"""Hardening of the harness client (runners/command.py, runners/proctree.py), issue #21 item 8:
a harness that never starts is given up after GIVE_UP_AFTER tries (one message, every cell marked), its stderr
is a bounded ring buffer (no file, no unbounded memory), and ending it ends descendants that left its session."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from runners.base import Errored, Rendered, RenderRequest
from runners.command import GIVE_UP_AFTER, STDERR_KEEP, CommandRunner

HARNESS = Path(__file__).parent / "harnesses" / "escaping.py"
MESSAGES = [{"role": "user", "content": "hi"}]


def _requests(count: int, templates: int = 1) -> list:
    return [RenderRequest.make(f"t{i % templates}", MESSAGES, template_id=f"t{i % templates}", case_id=f"c{i}")
            for i in range(count)]


def test_a_harness_that_never_starts_is_given_up_with_one_message(capfd):
    start_timeout = 0.5
    requests = _requests(93, templates=31)  # a 93-case run over 31 templates: one start attempt per template
    started = time.monotonic()
    with CommandRunner([sys.executable, str(HARNESS), "mute"], start_timeout=start_timeout) as runner:
        outcomes = list(runner.render_many(requests))
    elapsed = time.monotonic() - started
    assert len(outcomes) == len(requests) and all(isinstance(o, Errored) for o in outcomes)
    assert runner.given_up and f"after {GIVE_UP_AFTER} failed starts" in runner.given_up
    assert "given up" in outcomes[-1].message
    # GIVE_UP_AFTER start timeouts, not one per template: before, 60 s per cell (about 47 min for 93 cells).
    assert elapsed < GIVE_UP_AFTER * start_timeout + 15, f"took {elapsed:.1f} s"
    err = capfd.readouterr().err
    assert err.count("given up for this run") == 1, err


def test_retry_starts_gives_a_given_up_runner_another_chance():
    runner = CommandRunner([sys.executable, str(HARNESS), "mute"], start_timeout=0.3)
    try:
        list(runner.render_many(_requests(GIVE_UP_AFTER, templates=GIVE_UP_AFTER)))
        assert runner.given_up
        runner.retry_starts()
        assert runner.given_up is None
    finally:
        runner.close()


def _deleted_files() -> set:
    fds = Path("/proc/self/fd")
    found = set()
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith("(deleted)"):
            found.add(target)
    return found


def test_harness_stderr_is_a_bounded_ring_buffer():
    before = _deleted_files()  # pytest's own capture files
    env = dict(os.environ, NOISE_MB="64")
    runner = CommandRunner([sys.executable, str(HARNESS), "noisy"], env=env, start_timeout=60)
    try:
        assert runner.render(_requests(1)[0]) == Rendered("t0")
        (proc,) = runner._all
        proc.stderr.settle(0)  # the noise was written before the start response: it is all read by now
        deadline = time.monotonic() + 20
        while "the last line" not in proc.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        tail = proc.stderr_tail(STDERR_KEEP * 4)
        assert "the last line of the noise" in tail
        assert len(tail.encode()) <= STDERR_KEEP
        assert len(proc.stderr._data) <= 2 * STDERR_KEEP
        # No file holds it: the harness gave this process no deleted temporary file to grow.
        assert _deleted_files() <= before
    finally:
        runner.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the process-tree kill reads /proc (Linux)")
@pytest.mark.parametrize("mode", ["setsid", "doublefork"])
def test_ending_a_harness_ends_descendants_that_left_its_session(mode, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    runner = CommandRunner([sys.executable, str(HARNESS), mode, str(pidfile)], start_timeout=60)
    try:
        assert runner.render(_requests(1)[0]) == Rendered("t0")
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(pidfile.read_text())
        assert _alive(grandchild)
        assert os.getsid(grandchild) != os.getsid(runner._all[0].proc.pid), "the grandchild left the session"
    finally:
        runner.close()
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), f"{mode}: the grandchild {grandchild} outlived the run"
