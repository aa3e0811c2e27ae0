"""`chatgold site`: built from a real check run's report (evaluator + minijinja on three templates), then loaded in
a real headless Chromium (scripts/install-chromium.sh): pages load without console messages, search finds a
template and a cause, permalinks resolve, every link points at a file of the site, and every cell is counted."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conformance.cli import main
from conformance.report.site import build_site

CHROMIUM = os.environ.get("CHATGOLD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TEMPLATES = ("qwen-qwen3-0.6b", "abdelkareem-supra-50m-arabic-sft-mix", "01-ai-yi-1.5-9b-chat")
CASES = ("chat-single-user", "chat-system", "chat-multi-turn", "tool-multi-round")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("check") / "report.json"
    argv = ["check", "--runner", "evaluator", "--runner", "minijinja", "--workers", "1", "--json", str(out)]
    for template in TEMPLATES:
        argv += ["--template", template]
    for case in CASES:
        argv += ["--case", case]
    assert main(argv) in (0, 1)
    return out


@pytest.fixture(scope="module")
def site(report, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    assert main(["site", str(report), "--out", str(out)]) == 0
    return out


def _chromium(tmp_path, *args):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium missing: run scripts/install-chromium.sh")
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _load(tmp_path, url: str) -> str:
    """The DOM after scripts ran; fails on any console message (the site's scripts log nothing: an error, a
    missing file or a blocked load is what would)."""
    done = _chromium(tmp_path, "--dump-dom", url)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, f"{url}: {console}"
    return done.stdout


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])


def test_the_console_check_sees_a_script_error(tmp_path):
    """The check below can fail: a page whose script throws is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<!doctype html><body><script>undefinedFunction()</script></body>")
    with pytest.raises(AssertionError, match="undefinedFunction is not defined"):
        _load(tmp_path, page.as_uri())


def test_pages_load_search_finds_a_template_and_a_cause_and_permalinks_resolve(site, report, tmp_path):
    data = json.loads(report.read_text())
    causes = data["runners"]["minijinja"]["causes"]
    assert causes, "the selection has a MiniJinja cause ({% generation %})"
    cause = causes[0]
    for page in ("index.html", "engine/minijinja.html", "engine/evaluator.html", f"template/{TEMPLATES[0]}.html",
                 f"cause/{cause['id']}.html", "templates.html", "causes.html", "search.html"):
        dom = _load(tmp_path, (site / page).as_uri())
        assert "<main>" in dom
    # Search, client-side: a template by a word of its id, a cause by words of its title.
    dom = _load(tmp_path, (site / "search.html").as_uri() + "?q=qwen3")
    assert f'href="template/{TEMPLATES[0]}.html"' in dom and "1 result(s)" in dom
    words = "generation refuses"
    assert all(w in cause["title"] for w in words.split())
    dom = _load(tmp_path, (site / "search.html").as_uri() + "?q=" + words.replace(" ", "+"))
    assert f'href="cause/{cause["id"]}.html"' in dom
    # Permalinks: the cause's own page, its anchor on the engine page, the template page naming the cause.
    dom = _load(tmp_path, (site / "engine" / "minijinja.html").as_uri() + f"#{cause['id']}")
    finder = _Links()
    finder.feed(dom)
    assert cause["id"] in finder.ids
    dom = _load(tmp_path, (site / "template" / f"{TEMPLATES[1]}.html").as_uri())
    assert f'href="../cause/{cause["id"]}.html"' in dom


def test_every_link_resolves_and_the_emit_links_are_tests(site):
    pages = list(site.rglob("*.html"))
    for page in pages:
        finder = _Links()
        finder.feed(page.read_text(encoding="utf-8"))
        for link in finder.links:
            parts = urlsplit(link)
            if parts.scheme or not parts.path:
                continue  # external (upstream issues) or a same-page anchor
            target = (page.parent / parts.path).resolve()
            assert target.is_file(), f"{page.relative_to(site)} links to missing {link}"
            if parts.fragment and target.suffix == ".html":
                ids = _Links()
                ids.feed(target.read_text(encoding="utf-8"))
                assert parts.fragment in ids.ids, f"{page.relative_to(site)}: {link} has no anchor"
    engine = (site / "engine" / "minijinja.html").read_text()
    emitted = re.findall(r"href='\.\./(emit/minijinja/[^']+)'>(\w+)<", engine)
    assert {fmt for _, fmt in emitted} == {"minijinja", "pytest", "json", "issue"}
    cause_id = re.search(r"emit/minijinja/(c-[0-9a-f]+)/", emitted[0][0]).group(1)
    for path, fmt in emitted:
        text = (site / path).read_text()
        assert (cause_id if fmt in ("pytest", "issue") else "generation %}") in text


def test_the_emitted_pytest_fails_on_the_engine_with_the_cause(site, tmp_path):
    """The site's pytest for MiniJinja's `{% generation %}` cause fails on this binding (it has the cause): the
    reference refuses the empty conversation at render time, MiniJinja refuses to compile the template."""
    import sys

    tests = sorted((site / "emit" / "minijinja").glob("c-*/test_c_*.py"))
    assert [t.name.endswith("_minijinja.py") for t in tests] == [False, True]
    for test in tests:  # the pytest file and the snapshot input's binding check
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test.name],
                              cwd=test.parent, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "1 failed" in done.stdout and "refuses" in done.stdout, done.stdout


def test_every_cell_is_counted_per_engine_and_template(site, report):
    data = json.loads(report.read_text())
    for name, section in data["runners"].items():
        dom = (site / "engine" / f"{name}.html").read_text()
        row = re.search(r"<tr><td class=n>(\d+)</td>((?:<td class=n>\d*</td>)+)</tr>", dom)
        assert int(row.group(1)) == section["cells_total"]
        by_status = [int(n or 0) for n in re.findall(r"<td class=n>(\d*)</td>", row.group(2))]
        assert sum(by_status) == section["cells_total"] and by_status[0] == section["counts"]["match"]
    index = (site / "search-index.js").read_text()
    entries = json.loads(index[index.index("["):index.rindex("]") + 1])
    assert {e[1] for e in entries if e[0] == "template"} == set(TEMPLATES)
    assert {e[1] for e in entries if e[0] == "engine"} == {"evaluator", "minijinja"}


def test_history_adds_the_trend_by_version(report, tmp_path):
    """A real `chatgold history` file (minijinja 2.9.0 -> 2.10.2 on Qwen3): its versions, figures and the cause
    the later version fixed are on the index."""
    history = Path(__file__).resolve().parent / "data" / "site" / "history-minijinja.json"
    build_site([report], tmp_path / "site", [history])
    index = (tmp_path / "site" / "index.html").read_text()
    trend = index[index.index("<table class=trend>"):]
    rows = re.findall(r"<tr><td>([0-9.]+)</td><td class=n>([^<]+)</td>", trend)
    data = json.loads(history.read_text())
    assert rows == [(v["version"], f"{v['figure']['conformance']:.2f}%") for v in data["versions"]]
    assert "fixed: c-2a4b68283c a slice with a step" in trend and "(3 cells)" in trend
    bad = tmp_path / "not-history.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not-history.json: not a chatgold history"):
        build_site([report], tmp_path / "site2", [bad])


def test_bad_input_is_refused_with_the_file_named(report, tmp_path):
    # A sidecar missing a record: the counts no longer add up, and the site says so rather than drop the cell.
    broken = tmp_path / "broken"
    broken.mkdir()
    data = json.loads(report.read_text())
    cells = gzip.open(report.with_name("report.cells.jsonl.gz"), "rt").read().splitlines()
    assert cells
    data["cell_records"] = len(cells) - 1
    (broken / "report.json").write_text(json.dumps(data))
    with gzip.open(broken / "report.cells.jsonl.gz", "wt") as handle:
        handle.write("\n".join(cells[1:]) + "\n")
    with pytest.raises(ValueError, match=r"broken/report.json: runner \S+: the report's passed lists and cell records"):
        build_site([broken / "report.json"], tmp_path / "out")
    # A directory that is not a site is never emptied.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="not empty and not a site chatgold built"):
        build_site([report], mine)
    assert (mine / "notes.txt").read_text() == "keep"
    # A site built before is replaced.
    first = build_site([report], tmp_path / "again")
    assert build_site([report], tmp_path / "again")["files"] == first["files"]


def test_the_site_and_emit_import_no_engine():
    """Building a site or emitting a test loads no engine and no runner beyond what the report package itself
    loads (conformance/report/ is a pure output stage)."""
    import sys

    code = ("import sys; import conformance.report; before = set(sys.modules); "
            "import conformance.report.site, conformance.report.emit, conformance.cli.site; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "('runners', 'jinja2', 'minijinja', 'transformers')) + "
            "sorted(m for m in sys.modules if m in ('jinja2', 'minijinja', 'transformers')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
