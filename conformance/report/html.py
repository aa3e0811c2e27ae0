"""A static, self-contained HTML report (no scripts, no external resources): the runners x features and
runners x constructs matrix coloured by conformance, and a drill-down for diverged cells with golden and
output side by side (whitespace and control characters visible, the first differing byte marked) and the
template line that emitted the golden's first differing byte."""
from __future__ import annotations

import json
from html import escape

from conformance.judge.status import Verdict, describe_figure
from conformance.report import changes, templates
from conformance.report.render import REFUSAL_COLUMNS

MAX_DRILLDOWN = 300  # non-matching cells shown per runner (unexpected first); the cell records have them all
UNEXPECTED = (str(Verdict.UNEXPECTED_FAIL), str(Verdict.CHANGED))

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3;text-align:left}
td.name{text-align:left;font-family:monospace}
.c100{background:#2e7d32;color:#fff}.c95{background:#66bb6a}.c80{background:#d4e157}
.c50{background:#ffb74d}.c0{background:#e57373}.cna{background:#eee}
.matrix-wrap{overflow-x:auto}
.cell{border:1px solid #bbb;margin:.6em 0;padding:.3em .6em}
.cell.unexpected{border-color:#c62828;border-width:2px}
.side{display:grid;grid-template-columns:1fr 1fr;gap:.6em}
pre{white-space:pre-wrap;word-break:break-all;background:#fafafa;border:1px solid #ddd;padding:.4em;margin:.2em 0;
    font:12px/1.35 monospace;max-height:28em;overflow:auto}
mark.diff{background:#ffcdd2;outline:1px solid #c62828}
mark.first{background:#c62828;color:#fff}
.ws{color:#999}
.ctl{color:#fff;background:#7b1fa2;border-radius:2px;padding:0 1px}
.blame{background:#fff59d;display:block}
.lineno{color:#999;user-select:none}
.note{color:#6d4c41}
details.cause{border:1px solid #bbb;margin:.5em 0;padding:.3em .6em}
ul.cells{columns:2;font-size:12px}
"""


def _show_table() -> dict:
    table = {ord(" "): '<span class="ws">·</span>', ord("\n"): '<span class="ws">↵</span>\n',
             ord("\t"): '<span class="ws">→</span>\t', ord("\r"): '<span class="ctl">\\r</span>'}
    for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, 0xFEFF, 0x200B, 0x85]:
        label = f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"
        table.setdefault(code, f'<span class="ctl">{label}</span>')
    return table


_SHOW = _show_table()


def show(text: str) -> str:
    """Escaped HTML with whitespace and control characters visible (HTML escapes hold none of them, so the
    translation after escaping touches only the text's own characters)."""
    return escape(text).translate(_SHOW)


def _colour(value) -> str:
    if value is None:
        return "cna"
    return "c100" if value >= 100 else "c95" if value >= 95 else "c80" if value >= 80 else "c50" if value >= 50 else "c0"


def _matrix(report: dict, key: str, title: str) -> str:
    runners = list(report["runners"])
    rows = sorted({tag for s in report["runners"].values() for tag in s[key]})
    head = "".join(f"<th>{escape(r)}</th>" for r in runners)
    body = []
    for tag in rows:
        tds = []
        for r in runners:
            row = report["runners"][r][key].get(tag)
            if row is None:
                tds.append('<td class="cna">–</td>')
            else:
                pct = row["conformance"]
                tds.append(f'<td class="{_colour(pct)}" title="{row["matches"]}/{row["cells"]} match, '
                           f'{row["diverged"]} diverged">{"n/a" if pct is None else f"{pct:.1f}%"}</td>')
        body.append(f'<tr><td class="name">{escape(tag)}</td>{"".join(tds)}</tr>')
    return (f'<h2>{title}</h2><div class="matrix-wrap"><table class="matrix" id="matrix-{key}">'
            f'<tr><th>{key[:-1]}</th>{head}</tr>{"".join(body)}</table></div>')


def _side(window: dict, label: str) -> str:
    if not window:
        return f"<div><b>{label}</b><pre>(not recorded)</pre></div>"
    after = window["after"]
    first, rest = after[:1], after[1:]
    lead = "…" if window["start"] > 0 else ""
    tail = "…" if window.get("truncated_after") else ('<span class="ws">⟨end⟩</span>' if not after else "")
    return (f'<div><b>{label}</b> (from byte {window["start"]})<pre>{lead}{show(window["before"])}'
            f'<mark class="diff"><mark class="first">{show(first) or "⟨end⟩"}</mark>{show(rest)}</mark>{tail}</pre></div>')


def _template_excerpt(attribution: dict) -> str:
    if not attribution:
        return ""
    if "line" not in attribution:
        return f'<p class="note">{escape(attribution.get("unavailable", ""))}</p>'
    first = attribution.get("context_first_line", attribution["line"])
    lines = []
    for number, text in enumerate(attribution.get("context", []), first):
        cls = ' class="blame"' if number == attribution["line"] else ""
        lines.append(f'<span{cls}><span class="lineno">{number:5d} </span>{show(text)}</span>')
    return (f'<p>golden\'s first differing byte emitted by template line <b>{attribution["line"]}</b> '
            f'(<code>{escape(attribution["construct"])}</code>)'
            f'{" — the golden ends there" if attribution.get("at_golden_end") else ""}</p>'
            f'<pre class="template">{"".join(lines)}</pre>')


def _refusals(cell: dict) -> str:
    """Both sides of a cell where at least one refused: the engine's message or bytes, the reference's."""
    engine = cell.get("message") if cell["status"] != "engine-rendered" else cell.get("output", "")
    engine_label = "engine" + (f" refused ({cell['refusal']})" if cell.get("refusal") else " rendered")
    reference = cell.get("reference_message")
    reference_label = ("reference refused" + (f" ({cell['reference_refusal']})" if cell.get("reference_refusal") else "")
                       if reference is not None else "reference rendered (see the golden)")
    return (f'<div class="side"><div><b>{escape(reference_label)}</b><pre>{show(reference or "")}</pre></div>'
            f'<div><b>{escape(engine_label)}</b><pre>{show(engine or "")}</pre></div></div>')


MAX_CAUSES = 100         # causes shown per runner; the JSON holds them all
MAX_CAUSE_CELLS = 60    # affected cells listed per cause


def _outcome(label: str, outcome: dict) -> str:
    if outcome.get("kind") == "rendered":
        return f"<div><b>{escape(label)} rendered</b><pre>{show(outcome.get('text', ''))}<span class=\"ws\">⟨end⟩</span></pre></div>"
    kind = outcome.get("refusal") or outcome.get("kind", "")
    return (f"<div><b>{escape(label)} refused ({escape(str(kind))})</b>"
            f"<pre>{show(outcome.get('message', ''))}</pre></div>")


def _cause_detail(name: str, rank: int, cause: dict, command: str = "") -> str:
    repro = cause["repro"]
    cells = cause["cells"]
    listed = "".join(f"<li><code>{escape(t)}</code> × <code>{escape(c)}</code></li>" for t, c in cells[:MAX_CAUSE_CELLS])
    if len(cells) > MAX_CAUSE_CELLS:
        listed += f"<li>… and {len(cells) - MAX_CAUSE_CELLS} more (the JSON report lists every cell)</li>"
    statuses = ", ".join(f"{s} {n}" for s, n in sorted(cause.get("statuses", {}).items()))
    reason = cause.get("reason")
    link = cause.get("link")
    case = json.dumps(repro["case"], ensure_ascii=False, indent=1)
    tokens = ", ".join(f"{k} {json.dumps(repro.get(k))}" for k in ("bos_token", "eos_token"))
    confirmed = "rendered again on both sides: still differs" if repro.get("confirmed") else "not confirmed"
    return (f'<details class="cause" id="cause-{escape(name)}-{escape(cause["id"])}"><summary><b>{rank}.</b> '
            f'{escape(cause["title"])} — <b>+{cause["gain"]:.2f}</b> points '
            f'({len(cells)} cells in {cause["templates"]} template(s); <code>{escape(cause["id"])}</code>)</summary>'
            + (f'<p>{escape(reason)}' + (f' (<a href="{escape(link)}">{escape(link)}</a>)' if link else "") + "</p>"
               if reason else "")
            + f'<p class="note">{escape(statuses)}; constructs: {escape(", ".join(cause["constructs"]))}; '
              f'reproducer: {repro.get("lines", "?")} line(s), {repro.get("messages", "?")} message(s), {confirmed}; '
              f'{escape(tokens)}</p>'
            + (f'<p class="note">copy as command: <code class="command">{escape(command)}</code></p>' if command else "")
            + f'<div class="side"><div><b>template</b><pre>{show(repro["template"])}</pre></div>'
            f'<div><b>case</b><pre>{escape(case)}</pre></div></div>'
            f'<div class="side">{_outcome("reference", repro["reference"])}{_outcome("engine", repro["engine"])}</div>'
            f'<p>affected cells:</p><ul class="cells">{listed}</ul></details>')


def _number(value) -> str:
    """A count as a reader writes it: 62, not 62.0 (a median of an even number of counts may be 62.5)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "?" if value is None else str(value)


def _causes(name: str, section: dict) -> str:
    causes = section.get("causes")
    if causes is None:
        return ""
    stats = section.get("explain_stats", {})
    unexplained = section.get("unexplained", [])
    head = (f'<h3 id="causes-{escape(name)}">{escape(name)}: {len(causes)} root cause(s), ranked by the conformance '
            f'fixing each alone would gain; {len(unexplained)} cell(s) unexplained</h3>')
    if stats.get("median_lines") is not None:
        head += (f'<p class="note">median reproducer: {_number(stats["median_lines"])} template line(s), '
                 f'{_number(stats.get("median_messages"))} message(s)</p>')
    parts = [head]
    from conformance.report.changes import cause_command

    parts.extend(_cause_detail(name, rank, cause, cause_command(cause["id"], section))
                 for rank, cause in enumerate(causes[:MAX_CAUSES], 1))
    if len(causes) > MAX_CAUSES:
        parts.append(f'<p class="note">… {len(causes) - MAX_CAUSES} more causes in the JSON report</p>')
    reasons: dict = {}
    for entry in unexplained:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    if reasons:
        parts.append("<p>unexplained cells:</p><ul>" + "".join(
            f"<li>{n}: {escape(reason)}</li>" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + "</ul>")
    for entry in section.get("stale_causes", []):
        parts.append(f'<p class="note">known cause <code>{escape(entry["id"])}</code> ({escape(entry.get("title", ""))}) '
                     f'no longer reproduces: {escape(entry["reason"])}</p>')
    return "".join(parts)


def _cell_detail(name: str, cell: dict, open_: bool) -> str:
    unexpected = cell["verdict"] in UNEXPECTED
    expected = cell.get("expected") or {}
    reason = expected.get("reason", "")
    if not reason and expected.get("cause"):
        anchor = f"expected-{name}-{expected['cause']}"
        reason_html = (f'<p class="note">expected: held against known cause <a href="#{escape(anchor)}">'
                       f'<code>{escape(expected["cause"])}</code></a></p>')
    else:
        reason_html = f'<p class="note">expected: {escape(reason)}</p>' if reason else ""
    div = cell.get("divergence")
    where = f", byte {div['offset']} (line {div['line']}, column {div['column']})" if div else ""
    body = ""
    if div:
        body = (f'<div class="side">{_side(cell.get("golden_window"), "golden")}'
                f'{_side(cell.get("output_window"), "output")}</div>' + _template_excerpt(cell.get("attribution")))
    elif cell["status"] in ("errored", "timeout", "skipped", "no-golden"):
        body = f'<pre>{show(cell.get("message", ""))}</pre>' + (
            f'<pre>{show(cell["detail"])}</pre>' if cell.get("detail") else "")
    else:
        body = _refusals(cell)
    if cell.get("note"):
        body = f'<p class="note">{escape(cell["note"])}</p>' + body
    if cell.get("cause"):
        body = (f'<p>root cause: <a href="#cause-{escape(name)}-{escape(cell["cause"])}">'
                f'<code>{escape(cell["cause"])}</code></a></p>') + body
    return (f'<details{" open" if open_ else ""} class="cell{" unexpected" if unexpected else ""}" '
            f'data-cell="{escape(name)}/{escape(cell["template"])}/{escape(cell["case"])}">'
            f'<summary><code>{escape(cell["template"])}</code> × <code>{escape(cell["case"])}</code> — '
            f'{escape(cell["status"])}, {escape(str(cell["verdict"]))}{where}</summary>'
            + reason_html + body + "</details>")


def _drilldown(name: str, section: dict, cells: list) -> str:
    order = {"diverged": 0, "raised-differently": 1, "engine-raised": 2, "engine-rendered": 3}
    cells = sorted(cells, key=lambda c: (c["verdict"] not in UNEXPECTED, order.get(c["status"], 4),
                                         c["template"], c["case"]))
    by_status = {}
    for cell in cells:
        by_status[cell["status"]] = by_status.get(cell["status"], 0) + 1
    counts = ", ".join(f"{status} {n}" for status, n in sorted(by_status.items()))
    parts = [f'<h3 id="runner-{escape(name)}">{escape(name)}: {len(cells)} cell(s) that are not a pass'
             f'{" (" + escape(counts) + ")" if counts else ""}</h3>']
    if len(cells) > MAX_DRILLDOWN:
        parts.append(f'<p class="note">showing {MAX_DRILLDOWN} of {len(cells)} cells (unexpected first, then by '
                     f'status); the report\'s cell records (report.cells.jsonl.gz) hold every one.</p>')
    shown = cells[:MAX_DRILLDOWN]
    parts.extend(_cell_detail(name, cell, index == 0) for index, cell in enumerate(shown))
    # A known cause's reason once, not in each of its cells.
    said = section.get("expected_causes", {})
    held = sorted({expected["cause"] for expected in ((c.get("expected") or {}) for c in shown)
                   if "reason" not in expected and expected.get("cause") in said})
    if held:
        parts.append("<h4>Known causes the cells above are held against</h4><ul>" + "".join(
            f'<li id="{escape(f"expected-{name}-{cause}")}"><code>{escape(cause)}</code>: '
            f'{escape(said[cause]["reason"])}'
            + (f' (<a href="{escape(said[cause]["link"])}">{escape(said[cause]["link"])}</a>)'
               if said[cause].get("link") else "") + "</li>" for cause in held) + "</ul>")
    return "".join(parts)


def _value(value) -> str:
    return escape(json.dumps(value, ensure_ascii=False)[:200])


def _capability_agreement(report: dict) -> str:
    """Per capability agreement with llama.cpp, each row listing the templates it disagrees on."""
    section = report.get("capability_agreement")
    if not section:
        return ""
    engine = section.get("engine") or {}
    what = " ".join(str(engine[k]) for k in ("name", "version") if engine.get(k))
    rows = []
    for name, row in section["capabilities"].items():
        pct = None if row["agreement"] is None else 100 * row["agreement"]
        examples = "".join(f'<li><code>{escape(d["template"])}</code>: reference {_value(d.get("reference"))}, '
                           f'{escape(engine.get("name", "engine"))} {_value(d.get(engine.get("name", "llamacpp")))}</li>'
                           for d in row["disagreements"])
        unlisted = row["disagree"] - len(row["disagreements"])
        if unlisted > 0:
            examples += f"<li>… and {unlisted} more</li>"
        rows.append(f'<tr><td class="name">{escape(name)}</td><td>{row["compared"]}</td><td>{row["agree"]}</td>'
                    f'<td class="{_colour(pct)}">{"n/a" if pct is None else f"{pct:.1f}%"}</td>'
                    f'<td>{row["unknown"]}</td><td class="name">'
                    + (f"<ul>{examples}</ul>" if examples else "–") + "</td></tr>")
    source = f'; loaded from {escape(section["source"])}' if section.get("source") else ""
    over = f' over {section["templates"]} template(s)' if section.get("templates") is not None else ""
    return (f'<h2>{escape(engine.get("name", "engine"))} capability agreement</h2><p class="note">{escape(what)}{over}{source}: '
            'the engine\'s own view of each template (its reported capabilities, its generation prompt) '
            'against the capability goldens; unknown = one side could not tell.</p>'
            '<table id="capability-agreement"><tr><th>capability</th><th>compared</th><th>agree</th>'
            '<th>agreement</th><th>unknown</th><th>disagreeing templates</th></tr>' + "".join(rows) + "</table>")


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def _history_groups(groups: list, causes: dict, limit: int = 8) -> str:
    if not groups:
        return "–"
    items = []
    for group in groups[:limit]:
        examples = ", ".join(f'{escape(e["template"])} × {escape(e["case"])}' for e in group["examples"][:3])
        known = causes.get(group["cause"])
        what = f'<code>{escape(group["cause"])}</code>'
        if known:  # a root cause: its title, and its reproducer one click away
            what += (f' {escape(known["title"])}<details><summary>reproducer</summary>'
                     f'<pre>{escape(known["template"])}</pre></details>')
        items.append(f'<li><b>{group["cells"]}</b> cells / {group["templates"]} templates: '
                     f'{what}<br><span class="note">e.g. {examples}</span></li>')
    more = len(groups) - limit
    return "<ul>" + "".join(items) + (f"<li>… and {more} more causes</li>" if more > 0 else "") + "</ul>"


def _history(report) -> str:
    """The history view (`chatgold history`): conformance per version, then per pair of consecutive versions
    the causes introduced and fixed, then the templates whose verdict changed across versions."""
    history = report.get("history")
    if not history:
        return ""
    versions = [row["version"] for row in history["versions"]]
    rows = []
    for row, right in zip(history["versions"], history["summary"]["right_per_version"]):
        fig = row["figure"]
        rows.append(f'<tr><td class="name">{escape(row["version"])}</td>'
                    f'<td class="{_colour(fig["conformance"])}">{_percent(fig["conformance"])}</td>'
                    f'<td>{fig["judged"]}</td><td>{fig["passed"]}</td><td>{right}</td></tr>')
    changes, causes = [], history.get("causes") or {}
    for change in history["changes"]:
        changes.append(f'<tr><td class="name">{escape(change["from"])} → {escape(change["to"])}</td>'
                       f'<td>{change["cells_introduced"]}</td><td class="name">{_history_groups(change["introduced"], causes)}</td>'
                       f'<td>{change["cells_fixed"]}</td><td class="name">{_history_groups(change["fixed"], causes)}</td>'
                       f'<td>{change["cells_changed"]}</td></tr>')
    moved = [(t, row) for t, row in history["templates"].items() if len({str(v) for v in row["right"]}) > 1]
    template_rows = []
    for template, row in sorted(moved)[:300]:
        marks = "".join('<td class="c100">✓</td>' if ok else '<td class="cna">–</td>' if ok is None
                        else '<td class="c0">✗</td>' for ok in row["right"])
        template_rows.append(f'<tr><td class="name">{escape(template)}</td>{marks}'
                             f'<td class="name">{escape(row["first_right"] or "never")}</td>'
                             f'<td class="name">{escape(row["right_since"] or "–")}</td></tr>')
    head = "".join(f"<th>{escape(v)}</th>" for v in versions)
    return (f'<h2 id="history">History of {escape(history["engine"])}</h2>'
            f'<p class="note">causes are {escape(history["cause_kind"])} keys; a template is right at a version when '
            'every judged cell of it passes.</p>'
            '<table id="history-versions"><tr><th>version</th><th>conformance</th><th>judged</th><th>passed</th>'
            '<th>templates right</th></tr>' + "".join(rows) + "</table>"
            '<table id="history-changes"><tr><th>change</th><th>newly failing</th><th>introduced causes</th>'
            '<th>fixed</th><th>fixed causes</th><th>failing differently</th></tr>' + "".join(changes) + "</table>"
            f'<h3>Templates whose verdict changed ({len(moved)})</h3><div class="matrix-wrap">'
            f'<table id="history-templates"><tr><th>template</th>{head}<th>first right</th><th>right since</th></tr>'
            + "".join(template_rows) + "</table></div>")


def _properties(report: dict) -> str:
    """Golden-free template properties: per property how many templates violate it (by kind), then the
    templates with violations, each with its two-line explanations and minimal cases."""
    section = report.get("properties")
    if not section:
        return ""
    rows = []
    for name, row in section["properties"].items():
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(row["violation_kinds"].items(), key=lambda kv: -kv[1]))
        excepted = ", ".join(f"{k} {n}" for k, n in sorted(row["exception_kinds"].items(), key=lambda kv: -kv[1]))
        rows.append(f'<tr><td class="name">{escape(name)}</td><td>{row["violation"]}</td><td>{row["exception"]}</td>'
                    f'<td>{row["pass"]}</td><td>{row["not-applicable"]}</td><td class="name">{escape(kinds) or "–"}</td>'
                    f'<td class="name">{escape(excepted) or "–"}</td></tr>')
    items = []
    for template, found in list(section["violations"].items())[:MAX_DRILLDOWN]:
        lines = "".join(f'<li><b>{escape(v["property"])}</b> [{escape(v["kind"])}] in {v["count"]} case(s), minimal '
                        f'<code>{escape(v["case"])}</code>: {escape(v["explanation"][0])}<br>'
                        f'{escape(v["explanation"][1])}</li>' for v in found)
        items.append(f'<details><summary><code>{escape(template)}</code>: {len(found)} violation(s)</summary>'
                     f'<ul>{lines}</ul></details>')
    more = len(section["violations"]) - len(items)
    return ('<h2>Template properties</h2><p class="note">Checked through the reference on every case, no golden '
            f'needed: {section["recorded"]} of {section["templates"]} template(s) recorded, {section["clean"]} '
            'violate none. Intended exceptions (reasoning dropped from past turns, a prefill not replayed, a '
            'printed date, an input kind the template never renders) are counted apart.</p>'
            '<table id="properties"><tr><th>property</th><th>violated</th><th>exceptions only</th><th>pass</th>'
            '<th>n/a</th><th>violation kinds (templates)</th><th>intended exceptions (templates)</th></tr>'
            + "".join(rows) + "</table>" + "".join(items)
            + (f'<p class="note">… and {more} more template(s) with violations (see the JSON report)</p>' if more > 0 else ""))


def _audit(report: dict) -> str:
    """The suite's own sensitivity: revision pairs of one model's template, told apart or not, and how."""
    section = report.get("audit")
    if not section:
        return ""
    pct = None if section["sensitivity"] is None else 100 * section["sensitivity"]
    rows = []
    for row in section["rows"]:
        how = []
        if row["by_goldens"]["cases"]:
            how.append(f'goldens differ in {row["by_goldens"]["cases"]} case(s), e.g. '
                       + ", ".join(row["by_goldens"]["examples"][:3]))
        how.extend(f'{p["property"]}: {p["a"]["status"]} vs {p["b"]["status"]}' for p in row["by_properties"])
        if not row["told_apart"]:
            how.append("missed" + (f' (unrevealable: {row["unrevealable"]})' if row.get("unrevealable") else ""))
        rows.append(f'<tr><td class="name"><code>{escape(row["a"])}</code><br><code>{escape(row["b"])}</code></td>'
                    f'<td>{escape(row["how"])}</td><td class="name">{escape(row["found"])}</td>'
                    f'<td class="{"c100" if row["told_apart"] else "c0"}">{"yes" if row["told_apart"] else "no"}</td>'
                    f'<td class="name">{escape("; ".join(how))}</td></tr>')
    return (f'<h2>Suite audit</h2><p class="note">Revision pairs of one model\'s template found in the corpus data; '
            f'the suite tells {section["told_apart"]} of {section["pairs"]} apart '
            f'(<span class="{_colour(pct)}">{"n/a" if pct is None else f"{pct:.1f}%"}</span>), '
            f'{section["unrevealable"]} of the missed no case can reveal.</p>'
            '<table id="audit"><tr><th>pair</th><th>found by</th><th>data</th><th>told apart</th><th>how</th></tr>'
            + "".join(rows) + "</table>")


def render_html(report) -> str:
    summary_rows = []
    for name, s in report["runners"].items():
        v, fig = s["verdicts"], s["figure"]
        refused = "".join(f'<td>{s["counts"].get(status, 0)}</td>' for status, _ in REFUSAL_COLUMNS)
        summary_rows.append(
            f'<tr><td class="name"><a href="#runner-{escape(name)}">{escape(name)}</a></td>'
            f'<td class="{_colour(s["conformance"])}">{"n/a" if s["conformance"] is None else str(s["conformance"]) + "%"}</td>'
            f'<td>{"n/a" if fig["ran"] is None else str(fig["ran"]) + "%"}</td><td>{fig["cells"]}</td>'
            f'<td>{s["counts"]["diverged"]}</td>{refused}<td>{fig["not_run"]}</td>'
            f'<td>{v.get("unexpected-fail", 0)}</td><td>{v.get("changed", 0)}</td>'
            f'<td>{v.get("unexpected-pass", 0)}</td><td title="{escape(describe_figure(fig))}">'
            f'{escape(", ".join(c["title"] for c in s.get("causes", [])[:2]) or ", ".join(list(s["blamed_constructs"])[:3]))}</td></tr>')
    notes = sorted({n for s in report["runners"].values() for n in s["notes"]})
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>chatgold conformance report</title>'
        f'<style>{STYLE}</style></head><body><h1>chatgold conformance report</h1>'
        f'<p>generated {escape(report["generated"])}; {report["unexpected"]} unexpected outcome(s). '
        'Conformance counts the cells a runner ran; skipped cells and cells without a golden are outside it '
        '("ran").</p>'
        + "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
        + '<table id="summary"><tr><th>runner</th><th>conformance</th><th>ran</th><th>cells</th><th>diverged</th>'
          + "".join(f"<th>{label}</th>" for _, label in REFUSAL_COLUMNS)
          + '<th>not run</th><th>new cells</th><th>changed cells</th><th>now passing</th>'
          '<th>top causes</th></tr>' + "".join(summary_rows) + "</table>"
        + changes.html_section(report)
        + ("<h2>Root causes</h2>" + "".join(_causes(name, s) for name, s in report["runners"].items())
           if any("causes" in s for s in report["runners"].values()) else "")
        + _matrix(report, "features", "Conformance by case feature")
        + _matrix(report, "constructs", "Conformance by Jinja construct"
                  + (" (a cell counts against the constructs of its root cause)"
                     if any(s.get("constructs_basis") == "cause" for s in report["runners"].values()) else ""))
        + _capability_agreement(report)
        + templates.html_section(report)
        + _history(report)
        + _properties(report)
        + _audit(report)
        + "<h2>Cells that are not a pass</h2>"
        + "".join(_drilldown(name, s, report.runner_cells(name)) for name, s in report["runners"].items())
        + "</body></html>\n")

