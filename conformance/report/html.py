"""A static, self-contained HTML report (no scripts, no external resources): the runners x features and
runners x constructs matrix coloured by conformance, and a drill-down for diverged cells with golden and
output side by side (whitespace and control characters visible, the first differing byte marked) and the
template line that emitted the golden's first differing byte."""
from __future__ import annotations

import json
from html import escape

from conformance.judge.status import Verdict, describe_figure

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
"""


def show(text: str) -> str:
    """Escaped HTML with whitespace and control characters visible."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == " ":
            out.append('<span class="ws">·</span>')
        elif ch == "\n":
            out.append('<span class="ws">↵</span>\n')
        elif ch == "\t":
            out.append('<span class="ws">→</span>\t')
        elif ch == "\r":
            out.append('<span class="ctl">\\r</span>')
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or code in (0x2028, 0x2029, 0xFEFF, 0x200B, 0x85):
            label = f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"
            out.append(f'<span class="ctl">{label}</span>')
        else:
            out.append(escape(ch))
    return "".join(out)


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


def _cell_detail(name: str, cell: dict, open_: bool) -> str:
    unexpected = cell["verdict"] in UNEXPECTED
    reason = (cell.get("expected") or {}).get("reason", "")
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
    return (f'<details{" open" if open_ else ""} class="cell{" unexpected" if unexpected else ""}" '
            f'data-cell="{escape(name)}/{escape(cell["template"])}/{escape(cell["case"])}">'
            f'<summary><code>{escape(cell["template"])}</code> × <code>{escape(cell["case"])}</code> — '
            f'{escape(cell["status"])}, {escape(str(cell["verdict"]))}{where}</summary>'
            + (f'<p class="note">expected: {escape(reason)}</p>' if reason else "") + body + "</details>")


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
    parts.extend(_cell_detail(name, cell, index == 0) for index, cell in enumerate(cells[:MAX_DRILLDOWN]))
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
        refused = sum(s["counts"].get(k, 0) for k in ("raised-differently", "engine-raised", "engine-rendered"))
        summary_rows.append(
            f'<tr><td class="name"><a href="#runner-{escape(name)}">{escape(name)}</a></td>'
            f'<td class="{_colour(s["conformance"])}">{"n/a" if s["conformance"] is None else str(s["conformance"]) + "%"}</td>'
            f'<td>{"n/a" if fig["ran"] is None else str(fig["ran"]) + "%"}</td><td>{fig["cells"]}</td>'
            f'<td>{s["counts"]["diverged"]}</td><td>{refused}</td><td>{fig["not_run"]}</td>'
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
          '<th>refused differently</th><th>not run</th><th>new</th><th>changed</th><th>now passing</th>'
          '<th>top causes</th></tr>' + "".join(summary_rows) + "</table>"
        + _matrix(report, "features", "Conformance by case feature")
        + _matrix(report, "constructs", "Conformance by Jinja construct")
        + _capability_agreement(report)
        + _properties(report)
        + _audit(report)
        + "<h2>Cells that are not a pass</h2>"
        + "".join(_drilldown(name, s, report.runner_cells(name)) for name, s in report["runners"].items())
        + "</body></html>\n")

