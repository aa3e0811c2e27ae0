"""Smaller reliability points of issue 32 item 6: a harness that dies at start says why (the engine's own
TypeError), and an npm tag such as `latest` is resolved to its exact release once, so a retry finds it installed
instead of downloading it again."""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from runners.base import RunnerUnavailable
from runners.command import CommandRunner

DIES = ("import sys; sys.stdin.readline(); "
        "raise TypeError(\"Environment.__init__() got an unexpected keyword argument 'pycompat'\")")


def test_a_harness_that_dies_at_start_says_why(monkeypatch):
    monkeypatch.delenv("CHATGOLD_DEBUG", raising=False)
    runner = CommandRunner([sys.executable, "-c", DIES])
    with pytest.raises(RunnerUnavailable) as raised:
        runner._spawn()
    message = str(raised.value)
    assert "exit code 1" in message and "TypeError: Environment.__init__() got an unexpected keyword" in message
    assert "Traceback" not in message  # one line unless asked for more
    monkeypatch.setenv("CHATGOLD_DEBUG", "1")
    with pytest.raises(RunnerUnavailable) as raised:
        CommandRunner([sys.executable, "-c", DIES])._spawn()
    assert "Traceback (most recent call last)" in str(raised.value) and "TypeError" in str(raised.value)


FAKE_NPM = r'''#!PYTHON
"""npm as far as `view` and `install` go, for a registry that holds one release; each call is logged."""
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_NPM_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if args[0] == "view":
    print(json.dumps("9.8.7"))
elif args[0] == "install":
    spec = args[-1]
    package, _, version = spec.rpartition("@")
    if version != "9.8.7":
        print(f"npm error notarget No matching version found for {spec}", file=sys.stderr)
        sys.exit(1)
    target = Path("node_modules", *package.split("/"))
    target.mkdir(parents=True)
    (target / "package.json").write_text(json.dumps({"name": package, "version": version}))
'''


@pytest.mark.skipif(shutil.which("node") is None, reason="npm packages are for node")
def test_a_tag_is_resolved_once_and_installed_once(tmp_path, monkeypatch):
    import runners.versions as versions

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(FAKE_NPM.replace("PYTHON", sys.executable))
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(versions, "_RESOLVED", {})
    package = "@huggingface/jinja"
    first = versions.ensure_npm_package(package, "latest", "@huggingface/jinja latest")
    again = versions.ensure_npm_package(package, "latest", "@huggingface/jinja latest")  # a retry
    assert first == again and "9.8.7" in str(first)
    assert json.loads((first / "@huggingface" / "jinja" / "package.json").read_text())["version"] == "9.8.7"
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["view", "install"], calls
    # A new process asks npm which release `latest` is, and finds it installed.
    monkeypatch.setattr(versions, "_RESOLVED", {})
    assert versions.ensure_npm_package(package, "latest", "@huggingface/jinja latest") == first
    assert [c.split()[0] for c in log.read_text().splitlines()] == ["view", "install", "view"]
    # An exact version is never looked up.
    assert versions.resolve_npm_version(package, "9.8.7", "x") == "9.8.7"
