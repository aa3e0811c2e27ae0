"""The HTML report in a real headless Chromium (Debian's, installed by scripts/install-chromium.sh):
the matrix renders with conformance colours, a diverged cell's drill-down shows golden and output side
by side with the first differing byte marked and the attributed template line. Screenshot kept under
the pytest tmp dir."""
from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conformance.cli import main

CHROMIUM = os.environ.get("CHATGOLD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TEMPLATE = "ai21labs-ai21-jamba-reasoning-3b"
CASE = "tools-no-parameters"

# On CI the browser is installed by scripts/install-chromium.sh, so a missing one is a failure there.
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                reason="chromium missing: run scripts/install-chromium.sh (CI does)")


def _chromium(tmp_path, *args):
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


class _Finder(HTMLParser):
    """Collects what the DOM Chromium built contains: matrix cells and the drill-down pieces."""

    def __init__(self):
        super().__init__()
        self.matrix_classes, self.cells, self.marks, self.blame = [], [], [], []
        self._in = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._in.append((tag, attrs))
        if tag == "td" and any(t == "table" and a.get("class") == "matrix" for t, a in self._in):
            self.matrix_classes.append(attrs.get("class"))
        if tag == "details" and "data-cell" in attrs:
            self.cells.append(attrs["data-cell"])
        if tag == "mark" and attrs.get("class") == "first":
            self.marks.append("")
        if tag == "span" and attrs.get("class") == "blame":
            self.blame.append("")

    def handle_endtag(self, tag):
        while self._in and self._in.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self._in and self._in[-1][0] == "mark" and self._in[-1][1].get("class") == "first":
            self.marks[-1] += data
        if any(t == "span" and a.get("class") == "blame" for t, a in self._in) and self.blame:
            self.blame[-1] += data


def test_html_report_in_headless_chromium(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGOLD_EXPECTATIONS_DIR", str(tmp_path / "no-expectations"))
    html = tmp_path / "report.html"
    main(["check", "--runner", "minijinja", "--workers", "1", "--template", TEMPLATE, "--case", CASE,
          "--case", "chat-single-user", "--html", str(html)])
    url = html.as_uri()

    done = _chromium(tmp_path, "--dump-dom", url)
    assert done.returncode == 0, done.stderr[-2000:]
    finder = _Finder()
    finder.feed(done.stdout)
    # matrix: one coloured cell per (feature or construct) for the one runner
    assert finder.matrix_classes and set(finder.matrix_classes) <= {"name", "c100", "c95", "c80", "c50", "c0", "cna"}
    assert "c0" in finder.matrix_classes or "c50" in finder.matrix_classes  # the tojson divergence shows
    # drill-down: the diverged cell, its first differing byte in both columns, the blamed template line
    assert finder.cells == [f"minijinja/{TEMPLATE}/{CASE}"]
    assert finder.marks == ["'", "\\"]  # golden has the apostrophe; minijinja starts its \u0027 escape
    assert len(finder.blame) == 1 and "tojson" in finder.blame[0]
    assert "·" in done.stdout  # spaces made visible

    shot = tmp_path / "report.png"
    done = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
