"""`chatgold site`: a static, browsable site of every engine and version, template and cause (docs/site.md).

A pure function of report files: one or more reports (report.json and its sidecar of cell records, as
`chatgold check --json` and the gate write them) and optionally `chatgold history --history-json` files.
It imports no engine. One HTML file per page, so every page is a permalink:

    index.html                 engines and versions: conformance, cells by status, causes, badges, trends
    engine/<engine>.html       its causes ranked by gain, each with its reproducer and emitted tests
                               (anchor #<cause id>), unexplained cells, its templates
    template/<id>.html         every engine's verdict on the template and the causes that hit it
    cause/<id>.html            the cause and every engine (version) it affects
    templates.html, causes.html, search.html
    emit/<engine>/<cause>/     the cause as regression tests (conformance/report/emit.py)
    badges/<engine>.svg|.json  a badge per engine (SVG, and a shields.io endpoint)
    search-index.js            the search index (templates, causes, engines), read by assets/search.js

No framework and no network: plain HTML, one stylesheet and one script; it opens from disk or any static host.
Every cell is counted: per engine and per template the cells by status add up to the total shown.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Optional

from conformance.files import ENCODING_ERRORS
from conformance.judge.status import PASSING, STATUSES
from conformance.report import load_report
from conformance.report.emit import EmitError, emit, own_formats

UNEXPLAINED_SHOWN = 200   # unexplained cells listed per engine page (all are counted)
MARKER = ".chatgold-site"  # written into the output directory: a directory without it that is not empty is refused

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24}
header{background:#24292f;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none;font-weight:600}
header form{margin-left:auto}
header input{padding:4px 8px;width:260px}
main{padding:12px 16px}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f6f8fa}
td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:320px;white-space:pre-wrap;word-break:break-all}
.right{background:#dafbe1}.wrong{background:#ffebe9}.refused{background:#fff8c5}.muted{color:#57606a}
section.cause{border-top:1px solid #d0d7de;padding-top:6px;margin-top:12px}
#results li{margin:2px 0}
.kind{display:inline-block;min-width:70px;color:#57606a}
"""

SEARCH_JS = """// Client-side search over the site's index (search-index.js): every term must occur in an entry's id or title.
(function () {
  "use strict";
  var root = document.body.getAttribute("data-root") || "";
  var index = window.CHATGOLD_INDEX || [];
  var box = document.getElementById("q");
  var list = document.getElementById("results");
  var summary = document.getElementById("summary");
  function search(query) {
    var terms = query.toLowerCase().split(/\\s+/).filter(Boolean);
    if (!terms.length) return [];
    return index.filter(function (entry) {
      var text = (entry[1] + " " + entry[2]).toLowerCase();
      return terms.every(function (term) { return text.indexOf(term) !== -1; });
    });
  }
  function show(query) {
    if (!list) return;
    var found = search(query);
    list.textContent = "";
    found.slice(0, 200).forEach(function (entry) {
      var item = document.createElement("li");
      var kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = entry[0];
      var link = document.createElement("a");
      link.href = root + entry[3];
      link.textContent = entry[1] + (entry[2] && entry[2] !== entry[1] ? " \\u2014 " + entry[2] : "");
      item.appendChild(kind);
      item.appendChild(link);
      list.appendChild(item);
    });
    if (summary) summary.textContent = query ? found.length + " result(s)" + (found.length > 200 ? ", first 200 shown" : "") : "";
  }
  var initial = new URLSearchParams(window.location.search).get("q") || "";
  if (box) {
    box.value = initial;
    box.addEventListener("input", function () { show(box.value); });
  }
  show(initial);
})();
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _slug(name: str) -> str:
    """A file name for a runner spec (minijinja@2.9.0 -> minijinja@2.9.0; command:'x y' -> command-x-y-<hash>)."""
    slug = re.sub(r"[^A-Za-z0-9.@_-]+", "-", name).strip("-.") or "engine"
    if slug != name:
        slug = f"{slug[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return slug


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def _json_block(value) -> str:
    return f"<pre>{_e(json.dumps(value, ensure_ascii=False, indent=1))}</pre>"


def _outcome(outcome: Optional[dict]) -> str:
    if not outcome:
        return "<pre class=muted>(not recorded)</pre>"
    if outcome.get("kind") == "rendered":
        return f"<pre>{_e(json.dumps(outcome.get('text', ''), ensure_ascii=False))}</pre>"
    return f"<pre>{_e(outcome.get('kind'))} ({_e(outcome.get('refusal') or '')}): {_e(outcome.get('message', ''))}</pre>"


def _page(title: str, body: str, depth: int) -> str:
    up = "../" * depth
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><title>{_e(title)} · chatgold</title>"
            f"<link rel=stylesheet href='{up}assets/site.css'></head><body data-root='{up}'>"
            f"<header><a href='{up}index.html'>chatgold</a><a href='{up}templates.html'>templates</a>"
            f"<a href='{up}causes.html'>causes</a><form action='{up}search.html' method=get>"
            f"<input name=q placeholder='search templates, causes, engines' aria-label=search></form></header>"
            f"<main><h1>{_e(title)}</h1>{body}</main></body></html>\n")


class SiteData:
    """The reports' runners, cells and causes, indexed for the pages."""

    def __init__(self, reports: list, histories: list):
        self.runners: dict = {}        # name -> section
        self.sources: dict = {}        # name -> report path
        self.generated = []
        self.histories = histories
        # template -> runner -> Counter(status)
        self.template_status: dict = defaultdict(lambda: defaultdict(Counter))
        # template -> runner -> Counter(cause id)
        self.template_causes: dict = defaultdict(lambda: defaultdict(Counter))
        self.causes: dict = {}          # cause id -> {"title", "reason", "repro", "link", "runners": {name: cause}}
        for path, report in reports:
            self.generated.append(report.get("generated"))
            for name, section in report["runners"].items():
                if name in self.runners:
                    raise ValueError(f"{path}: runner {name!r} is also in {self.sources[name]}: one report per "
                                     f"engine version")
                self.runners[name] = section
                self.sources[name] = path
                for template, cases in section.get("passed", {}).items():
                    self.template_status[template][name]["match"] += len(cases)
                for cause in section.get("causes", []):
                    entry = self.causes.setdefault(cause["id"], {"title": cause.get("title", ""), "runners": {}})
                    entry["runners"][name] = cause
                    for key in ("reason", "repro", "link"):
                        if cause.get(key) and key not in entry:
                            entry[key] = cause[key]
            for cell in report.cells:
                if cell["runner"] not in report["runners"]:
                    raise ValueError(f"{path}: a cell record names runner {cell['runner']!r}, not in the report")
                self.template_status[cell["template"]][cell["runner"]][cell["status"]] += 1
                if cell.get("cause") and re.fullmatch(r"[A-Za-z0-9._-]+", cell["cause"]):
                    self.template_causes[cell["template"]][cell["runner"]][cell["cause"]] += 1
        for name, section in self.runners.items():
            counted = sum(sum(c.values()) for t in self.template_status.values() for r, c in t.items() if r == name)
            if counted != section["cells_total"]:
                raise ValueError(f"{self.sources[name]}: runner {name}: the report's passed lists and cell records "
                                 f"hold {counted} cells, its total is {section['cells_total']}")
        self.slugs = {name: _slug(name) for name in self.runners}
        if len(set(self.slugs.values())) != len(self.slugs):
            raise ValueError("two runner names map to one page name")


def _status_cells(counter: Counter) -> str:
    return "".join(f"<td class=n>{counter.get(str(s), 0) or ''}</td>" for s in STATUSES)


def _status_head() -> str:
    return "".join(f"<th>{_e(s)}</th>" for s in STATUSES)


def _badge_svg(label: str, message: str, colour: str) -> str:
    colours = {"brightgreen": "#4c1", "green": "#97ca00", "yellow": "#dfb317", "orange": "#fe7d37", "red": "#e05d44",
               "lightgrey": "#9f9f9f"}
    lw, mw = 7 * len(label) + 10, 7 * len(message) + 10
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{lw + mw}' height='20' role='img' "
            f"aria-label='{_e(label)}: {_e(message)}'><title>{_e(label)}: {_e(message)}</title>"
            f"<rect width='{lw}' height='20' fill='#555'/><rect x='{lw}' width='{mw}' height='20' "
            f"fill='{colours.get(colour, '#9f9f9f')}'/><g fill='#fff' font-family='Verdana,sans-serif' "
            f"font-size='11'><text x='5' y='14'>{_e(label)}</text><text x='{lw + 5}' y='14'>{_e(message)}</text>"
            f"</g></svg>\n")


def _index(data: SiteData) -> str:
    from conformance.report.render import badge

    rows = []
    for name, section in sorted(data.runners.items(), key=lambda kv: -(kv[1]["conformance"] or 0)):
        slug = data.slugs[name]
        basic = section.get("basic", {}).get("counts", {})
        rows.append(
            f"<tr><td><a href='engine/{_e(slug)}.html'>{_e(name)}</a></td><td>{_e(section['runner'].get('version', ''))}</td>"
            f"<td class=n>{_pct(section['conformance'])}</td><td class=n>{section['cells_total']}</td>"
            + _status_cells(Counter(section["counts"]))
            + f"<td class=n>{len(section.get('causes', []))}</td><td class=n>{len(section.get('unexplained', []))}</td>"
            f"<td class=n>{basic.get('right', 0)}/{basic.get('wrong', 0)}/{basic.get('refused', 0)}</td>"
            f"<td><img src='badges/{_e(slug)}.svg' alt='{_e(badge(section)['message'])}'></td></tr>")
    body = [f"<p>{len(data.runners)} engine version(s), {len(data.template_status)} template(s), "
            f"{len(data.causes)} cause(s). Reports generated {_e(', '.join(sorted({g for g in data.generated if g})))}."
            " Conformance: cells that match the reference of the cells judged.</p>",
            f"<table id=engines><tr><th>engine</th><th>version</th><th>conformance</th><th>cells</th>{_status_head()}"
            "<th>causes</th><th>unexplained</th><th>basic right/wrong/refused</th><th>badge</th></tr>",
            *rows, "</table>"]
    for history in data.histories:
        body.append(f"<h2>{_e(history['engine'])}: conformance by version</h2><table class=trend><tr><th>version</th>"
                    "<th>conformance</th><th>cells passed</th><th>fixed since previous</th><th>newly failing</th>"
                    "<th>causes fixed / introduced</th></tr>")
        changes = {c["to"]: c for c in history.get("changes", [])}
        titles = history.get("causes", {})
        for row in history["versions"]:
            change = changes.get(row["version"], {})
            moved = [(sign, group) for sign, key in (("fixed", "fixed"), ("introduced", "introduced"))
                     for group in change.get(key, [])]
            body.append(f"<tr><td>{_e(row['version'])}</td><td class=n>{_pct(row['figure'].get('conformance'))}</td>"
                        f"<td class=n>{row['figure'].get('passed', '')}</td><td class=n>{change.get('cells_fixed', '')}</td>"
                        f"<td class=n>{change.get('cells_introduced', '')}</td><td>"
                        + "<br>".join(f"{sign}: {_history_cause(data, group['cause'], titles)} ({group.get('cells', 0)} cells)"
                                      for sign, group in moved) + "</td></tr>")
        body.append("</table>")
    return _page("chatgold: chat template conformance", "".join(body), 0)


def _history_cause(data: SiteData, key: str, titles: dict) -> str:
    """A history's cause key: a link when the site has the cause's page, else the key and its title."""
    title = titles.get(key, {}).get("title", "")
    if key in data.causes:
        return f"<a href='cause/{_e(key)}.html'>{_e(key)}</a> {_e(title)}"
    return f"{_e(key)} {_e(title)}"


def _cause_block(data: SiteData, name: str, rank: int, cause: dict, emitted: dict) -> str:
    repro = cause.get("repro") or {}
    templates = sorted({t for t, _ in cause.get("cells", [])})
    links = " ".join(f"<a href='../template/{_e(t)}.html'>{_e(t)}</a>" for t in templates[:30])
    more = f" … {len(templates) - 30} more" if len(templates) > 30 else ""
    emit_links = " · ".join(f"<a href='../{_e(path)}'>{_e(fmt)}</a>" for fmt, path in emitted.get(cause["id"], {}).items())
    parts = [f"<section class=cause id='{_e(cause['id'])}'><h3>{rank}. <a href='../cause/{_e(cause['id'])}.html'>"
             f"{_e(cause['id'])}</a> {_e(cause.get('title', ''))}</h3>",
             f"<p>+{cause.get('gain', 0):.2f} pts if fixed · {len(cause.get('cells', []))} cell(s) in "
             f"{cause.get('templates', len(templates))} template(s) · <a href='#{_e(cause['id'])}'>permalink</a>"
             + (f" · <a href='{_e(cause['link'])}'>upstream</a>" if cause.get("link") else "") + "</p>"]
    if cause.get("reason"):
        parts.append(f"<p>{_e(cause['reason'])}</p>")
    if repro:
        parts += ["<details open><summary>reproducer</summary><p>template</p>",
                  f"<pre>{_e(repro.get('template', ''))}</pre><p>conversation</p>", _json_block(repro.get("case")),
                  "<p>reference (expected)</p>", _outcome(repro.get("reference")),
                  "<p>engine</p>", _outcome(repro.get("engine")), "</details>"]
    if emit_links:
        parts.append(f"<p>emit as a test: {emit_links}</p>")
    parts.append(f"<p>templates: {links}{more}</p></section>")
    return "".join(parts)


def _engine(data: SiteData, name: str, emitted: dict) -> str:
    section = data.runners[name]
    slug = data.slugs[name]
    counts = Counter(section["counts"])
    body = [f"<p>{_e(json.dumps(section['runner'], ensure_ascii=False))}</p>",
            f"<p><img src='../badges/{_e(slug)}.svg' alt='badge'> conformance {_pct(section['conformance'])} · "
            f"{section['cells_total']} cells · report {_e(Path(data.sources[name]).name)}</p>",
            f"<table><tr><th>cells</th>{_status_head()}</tr><tr><td class=n>{section['cells_total']}</td>"
            f"{_status_cells(counts)}</tr></table>"]
    causes = section.get("causes", [])
    body.append(f"<h2>{len(causes)} cause(s), ranked by what fixing each gains</h2>")
    body += [_cause_block(data, name, rank, cause, emitted.get(name, {})) for rank, cause in enumerate(causes, 1)]
    unexplained = section.get("unexplained", [])
    body.append(f"<h2>{len(unexplained)} unexplained cell(s)</h2>")
    if unexplained:
        body.append("<table><tr><th>template</th><th>case</th><th>status</th><th>why</th></tr>")
        for entry in unexplained[:UNEXPLAINED_SHOWN]:
            body.append(f"<tr><td><a href='../template/{_e(entry.get('template', ''))}.html'>{_e(entry.get('template', ''))}"
                        f"</a></td><td>{_e(entry.get('case', ''))}</td><td>{_e(entry.get('status', ''))}</td>"
                        f"<td>{_e(str(entry.get('reason', ''))[:300])}</td></tr>")
        body.append("</table>")
        if len(unexplained) > UNEXPLAINED_SHOWN:
            body.append(f"<p>… and {len(unexplained) - UNEXPLAINED_SHOWN} more (all in the report's JSON).</p>")
    body.append(f"<h2>templates</h2><table><tr><th>template</th><th>basic</th><th>cells</th>{_status_head()}</tr>")
    basic = section.get("basic", {}).get("templates", {})
    for template in sorted(data.template_status):
        counter = data.template_status[template].get(name)
        if not counter:
            continue
        verdict = basic.get(template, "")
        body.append(f"<tr><td><a href='../template/{_e(template)}.html'>{_e(template)}</a></td>"
                    f"<td class='{_e(verdict)}'>{_e(verdict)}</td><td class=n>{sum(counter.values())}</td>"
                    f"{_status_cells(counter)}</tr>")
    body.append("</table>")
    return _page(f"{name}", "".join(body), 1)


def _template(data: SiteData, template: str) -> str:
    body = [f"<table><tr><th>engine</th><th>basic</th><th>passed</th><th>cells</th>{_status_head()}<th>causes</th></tr>"]
    for name in sorted(data.template_status[template]):
        counter = data.template_status[template][name]
        section = data.runners[name]
        verdict = section.get("basic", {}).get("templates", {}).get(template, "")
        passed = sum(counter.get(str(s), 0) for s in PASSING)
        causes = data.template_causes[template].get(name, Counter())
        cause_links = "<br>".join(
            f"<a href='../cause/{_e(c)}.html'>{_e(c)}</a> {_e(data.causes.get(c, {}).get('title', ''))} ({n})"
            for c, n in causes.most_common())
        body.append(f"<tr><td><a href='../engine/{_e(data.slugs[name])}.html'>{_e(name)}</a></td>"
                    f"<td class='{_e(verdict)}'>{_e(verdict)}</td><td class=n>{passed}</td>"
                    f"<td class=n>{sum(counter.values())}</td>{_status_cells(counter)}<td>{cause_links}</td></tr>")
    body.append("</table>")
    return _page(template, "".join(body), 1)


def _cause(data: SiteData, cause_id: str, emitted: dict) -> str:
    entry = data.causes[cause_id]
    body = []
    if entry.get("reason"):
        body.append(f"<p>{_e(entry['reason'])}</p>")
    if entry.get("link"):
        body.append(f"<p><a href='{_e(entry['link'])}'>upstream</a></p>")
    body.append("<h2>engines it affects</h2><table><tr><th>engine</th><th>cells</th><th>templates</th>"
                "<th>gain if fixed</th><th>emit</th></tr>")
    for name, cause in sorted(entry["runners"].items()):
        links = " · ".join(f"<a href='../{_e(p)}'>{_e(f)}</a>" for f, p in emitted.get(name, {}).get(cause_id, {}).items())
        body.append(f"<tr><td><a href='../engine/{_e(data.slugs[name])}.html#{_e(cause_id)}'>{_e(name)}</a></td>"
                    f"<td class=n>{len(cause.get('cells', []))}</td><td class=n>{cause.get('templates', '')}</td>"
                    f"<td class=n>+{cause.get('gain', 0):.2f}</td><td>{links}</td></tr>")
    body.append("</table>")
    repro = entry.get("repro")
    if repro:
        body += ["<h2>reproducer</h2><p>template</p>", f"<pre>{_e(repro.get('template', ''))}</pre><p>conversation</p>",
                 _json_block(repro.get("case")), "<p>reference (expected)</p>", _outcome(repro.get("reference")),
                 "<p>engine</p>", _outcome(repro.get("engine"))]
    templates = sorted({t for cause in entry["runners"].values() for t, _ in cause.get("cells", [])})
    body.append(f"<h2>{len(templates)} template(s)</h2><p>"
                + " ".join(f"<a href='../template/{_e(t)}.html'>{_e(t)}</a>" for t in templates) + "</p>")
    return _page(f"{cause_id}: {entry['title']}", "".join(body), 1)


def _emit_all(data: SiteData, out: Path, formats: Optional[Iterable[str]]) -> dict:
    """emit/<engine>/<cause>/<files>: {runner: {cause id: {format: relative path of its first file}}}.
    formats None: each engine's own (emit.own_formats)."""
    emitted: dict = {}
    chosen = list(formats) if formats is not None else None
    for name, section in data.runners.items():
        formats = chosen if chosen is not None else own_formats(section["runner"])
        for cause in section.get("causes", []):
            if not isinstance(cause.get("repro"), dict) or "template" not in cause["repro"]:
                continue
            directory = Path("emit") / data.slugs[name] / cause["id"]
            for fmt in formats:
                try:
                    files = emit(cause, fmt, section["runner"], {"name": "hf"})
                except EmitError:
                    continue  # e.g. a reproducer whose reference outcome is not recorded: no test to write
                (out / directory).mkdir(parents=True, exist_ok=True)
                for file_name, text in files.items():
                    (out / directory / file_name).write_text(text, encoding="utf-8", errors=ENCODING_ERRORS)
                emitted.setdefault(name, {}).setdefault(cause["id"], {})[fmt] = (directory / next(iter(files))).as_posix()
    return emitted


def _prepare(out: Path) -> None:
    """The output directory: new, empty, or a site chatgold built before (replaced); anything else is refused."""
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not (out / MARKER).is_file():
            raise ValueError(f"{out}: not empty and not a site chatgold built; choose a new or empty directory")
        if (out / MARKER).is_file():
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("built by chatgold site; the whole directory is replaced on the next build\n")


def build_site(report_paths: list, out, history_paths: Iterable = (), formats: Optional[Iterable[str]] = None) -> dict:
    """Build the site into `out`; returns {"pages", "files", "bytes", "seconds", ...}. formats: the emitted tests
    beside each cause (None: each engine's own formats, the JSON vector and the issue)."""
    started = time.monotonic()
    reports = [(Path(p), load_report(p)) for p in report_paths]
    if not reports:
        raise ValueError("chatgold site: no report given")
    histories = []
    for path in history_paths:
        try:
            histories.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable history JSON: {exc}") from None
        if not isinstance(histories[-1], dict) or "versions" not in histories[-1]:
            raise ValueError(f"{path}: not a chatgold history (no `versions`)")
    data = SiteData(reports, histories)
    out = Path(out)
    _prepare(out)
    (out / "assets").mkdir()
    (out / "assets" / "site.css").write_text(CSS.lstrip(), encoding="utf-8")
    (out / "assets" / "search.js").write_text(SEARCH_JS, encoding="utf-8")
    from conformance.report.render import badge

    (out / "badges").mkdir()
    for name, section in data.runners.items():
        shield = badge(section)
        shield["label"] = f"chatgold {name}"
        (out / "badges" / f"{data.slugs[name]}.json").write_text(json.dumps(shield) + "\n", encoding="utf-8")
        (out / "badges" / f"{data.slugs[name]}.svg").write_text(
            _badge_svg(shield["label"], shield["message"], shield["color"]), encoding="utf-8")
    emitted = _emit_all(data, out, formats)
    pages = {"index.html": _index(data)}
    for name in data.runners:
        pages[f"engine/{data.slugs[name]}.html"] = _engine(data, name, emitted)
    for template in data.template_status:
        pages[f"template/{template}.html"] = _template(data, template)
    for cause_id in data.causes:
        pages[f"cause/{cause_id}.html"] = _cause(data, cause_id, emitted)
    pages["templates.html"] = _page("templates", "<ul>" + "".join(
        f"<li><a href='template/{_e(t)}.html'>{_e(t)}</a></li>" for t in sorted(data.template_status)) + "</ul>", 0)
    pages["causes.html"] = _page("causes", "<table><tr><th>cause</th><th>title</th><th>engines</th><th>cells</th></tr>"
                                 + "".join(f"<tr><td><a href='cause/{_e(c)}.html'>{_e(c)}</a></td><td>{_e(e['title'])}</td>"
                                           f"<td class=n>{len(e['runners'])}</td><td class=n>"
                                           f"{sum(len(x.get('cells', [])) for x in e['runners'].values())}</td></tr>"
                                           for c, e in sorted(data.causes.items(), key=lambda kv: -sum(
                                               len(x.get('cells', [])) for x in kv[1]['runners'].values())))
                                 + "</table>", 0)
    pages["search.html"] = _page("search", "<p><input id=q autofocus placeholder='template id, cause id or words of a "
                                 "title' aria-label=search></p><p id=summary class=muted></p><ul id=results></ul>"
                                 "<script src='search-index.js'></script><script src='assets/search.js'></script>", 0)
    for relative, text in pages.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", errors=ENCODING_ERRORS)
    index = [["engine", name, section["runner"].get("version", ""), f"engine/{data.slugs[name]}.html"]
             for name, section in data.runners.items()]
    index += [["template", t, "", f"template/{t}.html"] for t in sorted(data.template_status)]
    index += [["cause", c, e["title"], f"cause/{c}.html"] for c, e in sorted(data.causes.items())]
    (out / "search-index.js").write_text("window.CHATGOLD_INDEX = " + json.dumps(index, ensure_ascii=False) + ";\n",
                                         encoding="utf-8")
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"pages": len(pages), "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "seconds": round(time.monotonic() - started, 2), "engines": len(data.runners),
            "templates": len(data.template_status), "causes": len(data.causes)}
