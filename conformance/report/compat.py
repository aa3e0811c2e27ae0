"""Writers of a `chatgold compat` record (conformance/schemas/compat.schema.json): terminal, Markdown, HTML.
SARIF is in report/sarif.py. Reads the record only (no engine, no golden)."""
from __future__ import annotations

from html import escape

BUCKET_LABELS = (("right", "right"), ("differs", "differ"), ("refuses", "refuse"), ("no-answer", "no answer"),
                 ("not-run", "not run"))


def _verdict(engine: dict) -> str:
    return "renders right" if engine["renders_right"] else "FAILS"


def _counts(engine: dict) -> str:
    return ", ".join(f"{engine['counts'][key]} {label}" for key, label in BUCKET_LABELS if engine["counts"][key]
                     or key in ("right", "differs", "refuses"))


def _cause_line(cause: dict) -> str:
    where = f" (template line {cause['line']})" if cause.get("line") else ""
    known = {"baseline": "known, from the baseline", "mechanism": "known, matched by mechanism",
             "reduced": "known, found by reduction" if cause["known"] else "new, found by reduction"}[cause["how"]]
    return f"{cause['id']} [{known}]{where}: {cause['title'] or '(no title)'}"


def where_it_renders(template: dict) -> str:
    """Which engines render the template right, which fail it (with how many cases) and which were not run."""
    right = [e["engine"] for e in template["engines"] if e["renders_right"]]
    failing = [f"{e['engine']} ({e['counts']['differs'] + e['counts']['refuses'] + e['counts']['no-answer']} of "
               f"{e['cases']} cases)" for e in template["engines"] if not e["renders_right"]]
    parts = [f"renders right on: {', '.join(right) or 'none'}", f"fails on: {', '.join(failing) or 'none'}"]
    if template.get("not_run"):
        parts.append("not run: " + ", ".join(f"{n['engine']} ({n['why']})" for n in template["not_run"]))
    return "; ".join(parts)


def terminal(record: dict, detail: int = 5) -> str:
    lines = []
    for template in record["templates"]:
        ref = template["reference"]
        head = template["template"]
        lines.append(f"{head['name']} (bos {head['bos_token']!r}, eos {head['eos_token']!r}): {_reference(ref)}")
        if head.get("corpus_id"):
            lines.append(f"  (the same bytes as corpus template {head['corpus_id']})")
        width = max([len(e["engine"]) for e in template["engines"]] + [6])
        for engine in template["engines"]:
            lines.append(f"  {engine['engine']:<{width}}  {_verdict(engine):<13}  {_counts(engine)}")
            for cause in engine["causes"]:
                lines.append(f"      {len(cause['cases'])} case(s): {_cause_line(cause)}")
                if cause.get("reason"):
                    lines.append(f"          why: {_short(cause['reason'], 300)}")
            loose = [f for f in engine["failures"] if not f.get("cause") and f["bucket"] != "not-run"]
            for failure in loose[:detail]:
                lines.append(f"      {failure['case']}: {failure['status']}, no known cause"
                             + (f": {_short(failure['message'], 160)}" if failure.get("message") else ""))
            if len(loose) > detail:
                lines.append(f"      ... {len(loose) - detail} more without a known cause (--format json lists all)")
        lines.append(f"  {where_it_renders(template)}")
    lines.append("every selected engine renders every case right" if record["renders_right_everywhere"]
                 else "not every selected engine renders every case right")
    return "\n".join(lines)


def _reference(ref: dict) -> str:
    text = f"the reference renders {ref['rendered']} of {ref['cases']} cases, raises on {ref['raised']}"
    if ref["failed"]:
        text += f", gives no answer on {len(ref['failed'])} (their cells are not run)"
    return text


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def markdown(record: dict) -> str:
    out = ["# chatgold compat", ""]
    for template in record["templates"]:
        head, ref = template["template"], template["reference"]
        out.append(f"## `{head['name']}`")
        out.append("")
        out.append(_reference(ref) + ".")
        out.append("")
        out.append(_md(where_it_renders(template)) + ".")
        out.append("")
        out.append("| engine | verdict | " + " | ".join(label for _, label in BUCKET_LABELS) + " |")
        out.append("|---|---|" + "---:|" * len(BUCKET_LABELS))
        for engine in template["engines"]:
            out.append(f"| {engine['engine']} {engine['version']} | {_verdict(engine)} | "
                       + " | ".join(str(engine["counts"][key]) for key, _ in BUCKET_LABELS) + " |")
        out.append("")
        for engine in template["engines"]:
            if not engine["causes"] and not engine["unexplained"]:
                continue
            out.append(f"### {engine['engine']}")
            out.append("")
            for cause in engine["causes"]:
                out.append(f"- {len(cause['cases'])} case(s): {_md(_cause_line(cause))}"
                           + (f" — {_md(_short(cause['reason'], 400))}" if cause.get("reason") else ""))
            if engine["unexplained"]:
                cases = [f["case"] for f in engine["failures"] if not f.get("cause") and f["bucket"] in
                         ("differs", "refuses")]
                out.append(f"- {engine['unexplained']} case(s) without a known cause: "
                           + ", ".join(f"`{c}`" for c in cases[:20]) + (" ..." if len(cases) > 20 else ""))
            out.append("")
    out.append("Every selected engine renders every case right." if record["renders_right_everywhere"]
               else "**Not every selected engine renders every case right.**")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def html(record: dict) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>chatgold compat</title><style>"
             "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "th,td{border:1px solid #ccc;padding:2px 6px}td.n{text-align:right}.ok{background:#c8e6c9}"
             ".bad{background:#ffcdd2}pre{background:#fafafa;border:1px solid #ddd;padding:.4em;white-space:pre-wrap}"
             "</style></head><body><h1>chatgold compat</h1>"]
    for template in record["templates"]:
        head, ref = template["template"], template["reference"]
        parts.append(f"<h2>{escape(head['name'])}</h2><p>{escape(_reference(ref))}.</p>"
                     f"<p>{escape(where_it_renders(template))}.</p><table><tr><th>engine</th><th>verdict</th>"
                     + "".join(f"<th>{escape(label)}</th>" for _, label in BUCKET_LABELS) + "</tr>")
        for engine in template["engines"]:
            cls = "ok" if engine["renders_right"] else "bad"
            parts.append(f"<tr><td>{escape(engine['engine'])} {escape(engine['version'])}</td>"
                         f"<td class='{cls}'>{escape(_verdict(engine))}</td>"
                         + "".join(f"<td class='n'>{engine['counts'][key]}</td>" for key, _ in BUCKET_LABELS)
                         + "</tr>")
        parts.append("</table>")
        for engine in template["engines"]:
            if not engine["failures"]:
                continue
            parts.append(f"<h3>{escape(engine['engine'])}</h3><ul>")
            for cause in engine["causes"]:
                parts.append(f"<li>{len(cause['cases'])} case(s): {escape(_cause_line(cause))}"
                             + (f"<br><small>{escape(cause['reason'])}</small>" if cause.get("reason") else "")
                             + (f"<pre>{escape(cause['reproducer'][:2000])}</pre>" if cause.get("reproducer") else "")
                             + "</li>")
            parts.append("</ul><table><tr><th>case</th><th>status</th><th>cause</th><th>line</th><th>detail</th></tr>")
            for failure in engine["failures"]:
                detail = failure.get("message", "")
                if failure.get("reference"):
                    detail = (f"reference: …{failure['reference']['after'][:80]!r}\nengine: "
                              f"…{failure['engine']['after'][:80]!r}")
                parts.append(f"<tr><td>{escape(failure['case'])}</td><td>{escape(failure['status'])}</td>"
                             f"<td>{escape(failure.get('cause') or '')}</td><td>{failure.get('line') or ''}</td>"
                             f"<td><pre>{escape(detail[:600])}</pre></td></tr>")
            parts.append("</table>")
    parts.append("<p>" + ("Every selected engine renders every case right." if record["renders_right_everywhere"]
                          else "<b>Not every selected engine renders every case right.</b>") + "</p></body></html>")
    return "".join(parts)
