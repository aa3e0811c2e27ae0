"""Per-template views of one runner's judged results, for the report: what the engine decided about each
template (its template facts, e.g. llama.cpp's built-in format), whether it renders the basic conversations
right, wrongly or refuses them, and token parity (judge/tokens.py). Pure: everything comes from the judged
results and the runner description the render stage recorded (render/stage.runner_info)."""
from __future__ import annotations

from collections import Counter

from conformance.judge.status import NOT_JUDGED, PASSING, Status

# The basic conversations a template is first judged on (one user turn; system + user; several turns), the
# shape of the public comparisons of built-in chat formats with transformers.
BASIC_CASES = ("chat-single-user", "chat-system", "chat-multi-turn")
BASIC_VERDICTS = ("right", "wrong", "refused", "not run")
REFUSED = frozenset({Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY})
TOKEN_EXAMPLES = 40
BOS_LISTS = ("duplicated-bos", "added-bos", "missing-bos")


def basic_verdict(statuses: list) -> str:
    """right: every basic cell passes; refused: the engine refuses every one it ran; wrong: it renders at
    least one differently (or renders where the reference refuses); not run: none was judged."""
    judged = [s for s in statuses if s not in NOT_JUDGED and s not in (Status.ERRORED, Status.TIMEOUT)]
    if not judged:
        return "not run"
    if all(s in PASSING for s in judged):
        return "right"
    if all(s in REFUSED for s in judged):
        return "refused"
    return "wrong"


def template_views(run) -> dict:
    """{"template_facts"?, "basic", "tokens"?} for a runner section."""
    out: dict = {}
    facts = run.info.get("template_facts")
    if facts:
        out["template_facts"] = dict(sorted(facts.items()))
    by_template: dict = {}
    token_rows: dict = {}
    bos_rows: dict = {}
    flags: dict = {}
    token_counts: Counter = Counter()
    examples: list = []
    for result in run.results:
        if result.case_id in BASIC_CASES:
            by_template.setdefault(result.template_id, []).append(result.status)
        verdict = result.tokens
        if verdict:
            token_counts[verdict["status"]] += 1
            row = token_rows.setdefault(result.template_id, {})
            row[verdict["status"]] = row.get(verdict["status"], 0) + 1
            if verdict.get("flags") and result.template_id not in flags:
                flags[result.template_id] = verdict["flags"]
            if verdict.get("bos"):
                row = bos_rows.setdefault(result.template_id, {})
                row[verdict["bos"]] = row.get(verdict["bos"], 0) + 1
            if verdict["status"] not in ("token-match", "unknown", "not-compared") and len(examples) < TOKEN_EXAMPLES:
                examples.append({"template": result.template_id, "case": result.case_id, **verdict})
    out["basic"] = {"cases": list(BASIC_CASES),
                    "templates": {t: basic_verdict(s) for t, s in sorted(by_template.items())}}
    if token_rows:
        out["tokens"] = {"counts": dict(token_counts), "templates": dict(sorted(token_rows.items())),
                         "bos_by_template": dict(sorted(bos_rows.items())), "flags": dict(sorted(flags.items())),
                         "examples": examples}
    return out


def merge_views(into: dict, section: dict) -> None:
    """Add one shard's per-template views to a merged runner section (shards hold disjoint templates)."""
    if section.get("template_facts"):
        into.setdefault("template_facts", {}).update(section["template_facts"])
    if section.get("basic"):
        basic = into.setdefault("basic", {"cases": section["basic"]["cases"], "templates": {}})
        basic["templates"].update(section["basic"]["templates"])
    if section.get("tokens"):
        tokens = into.setdefault("tokens", {"counts": {}, "templates": {}, "bos_by_template": {}, "flags": {},
                                            "examples": []})
        for status, n in section["tokens"]["counts"].items():
            tokens["counts"][status] = tokens["counts"].get(status, 0) + n
        tokens["templates"].update(section["tokens"]["templates"])
        tokens["bos_by_template"].update(section["tokens"]["bos_by_template"])
        tokens["flags"].update(section["tokens"].get("flags", {}))
        room = TOKEN_EXAMPLES - len(tokens["examples"])
        tokens["examples"].extend(section["tokens"]["examples"][:max(room, 0)])


def finalize_views(section: dict) -> None:
    """Derived numbers: the basic verdict counts, per template the token verdict, the BOS lists."""
    basic = section.get("basic")
    if basic is not None:
        basic["templates"] = dict(sorted(basic["templates"].items()))
        found = Counter(basic["templates"].values())
        basic["counts"] = {verdict: found.get(verdict, 0) for verdict in BASIC_VERDICTS}
        facts = section.get("template_facts") or {}
        grouping = None
        if any("builtin_format" in f for f in facts.values()):
            grouping = ("detected built-in format", lambda f: f.get("builtin_format") or "(not recognised)")
        elif any("ollama.route" in f for f in facts.values()):  # the ollama runner: its route and Go template
            grouping = ("Ollama's choice", lambda f: " ".join(filter(None, (f.get("ollama.route", "(not run)"),
                                                                             f.get("ollama.template")))))
        if grouping is not None:
            formats: dict = {}
            for template, verdict in basic["templates"].items():
                name = grouping[1](facts.get(template) or {})
                formats.setdefault(name, Counter())[verdict] += 1
            basic["by_format"] = {name: {v: c.get(v, 0) for v in BASIC_VERDICTS}
                                  for name, c in sorted(formats.items(), key=lambda kv: -sum(kv[1].values()))}
            basic["by_format_label"] = grouping[0]
    tokens = section.get("tokens")
    if tokens is not None:
        tokens["templates"] = dict(sorted(tokens["templates"].items()))
        bos = tokens["bos_by_template"] = dict(sorted(tokens["bos_by_template"].items()))
        tokens["bos"] = {name: sorted(t for t, row in bos.items() if row.get(name)) for name in BOS_LISTS}
        compared = sum(n for status, n in tokens["counts"].items() if status not in ("unknown", "not-compared"))
        tokens["template_counts"] = {
            "templates": len(tokens["templates"]),
            "bos_judged": len(bos),                                   # at least one cell with a BOS verdict
            "bos_clean": sum(1 for row in bos.values() if set(row) == {"match"}),
            **{name: len(tokens["bos"][name]) for name in BOS_LISTS},
            "bos_unknown": len(tokens["templates"]) - len(bos),
            "cells_compared": compared,                               # cells with a full token verdict
            "cells_token_match": tokens["counts"].get("token-match", 0),
        }


# -- rendering (terminal, Markdown, HTML) --------------------------------------------------------------------

def _basic_line(basic: dict) -> str:
    c = basic["counts"]
    return (f"{c['right']} right, {c['wrong']} wrong, {c['refused']} refused"
            + (f", {c['not run']} not run" if c["not run"] else ""))


def _token_line(tokens: dict) -> str:
    t = tokens["template_counts"]
    return (f"{t['bos_judged']} of {t['templates']} templates with a BOS verdict: {t['duplicated-bos']} double the "
            f"BOS, {t['added-bos']} add one, {t['missing-bos']} miss it, {t['bos_clean']} clean; "
            f"{t['cells_token_match']} of {t['cells_compared']} compared cells token-identical")


def terminal_lines(report) -> list:
    lines = []
    for name, section in report["runners"].items():
        if section.get("basic") and section["basic"]["templates"]:
            lines.append(f"{name}: templates on the basic conversations: {_basic_line(section['basic'])}")
        if section.get("tokens"):
            lines.append(f"{name}: token parity: {_token_line(section['tokens'])}")
    return lines


def markdown_lines(report) -> list:
    out = []
    rows = [(n, s) for n, s in report["runners"].items() if s.get("basic") and s["basic"]["templates"]]
    if rows:
        cases = ", ".join(f"`{c}`" for c in rows[0][1]["basic"]["cases"])
        out += [f"### Templates on the basic conversations ({cases})", "",
                "| runner | right | wrong | refused | not run |", "|---|---:|---:|---:|---:|"]
        for name, s in rows:
            c = s["basic"]["counts"]
            out.append(f"| {name} | {c['right']} | {c['wrong']} | {c['refused']} | {c['not run']} |")
        out.append("")
        for name, s in rows:
            if s["basic"].get("by_format"):
                label = s["basic"].get("by_format_label", "detected built-in format")
                out += [f"<details><summary>{name}: by {label}</summary>\n",
                        "| format | right | wrong | refused | not run |", "|---|---:|---:|---:|---:|"]
                for fmt, c in s["basic"]["by_format"].items():
                    out.append(f"| `{fmt}` | {c['right']} | {c['wrong']} | {c['refused']} | {c['not run']} |")
                out.append("\n</details>\n")
    rows = [(n, s) for n, s in report["runners"].items() if s.get("tokens")]
    if rows:
        out += ["### Token parity (the tokens each engine feeds its model)", "",
                "| runner | templates | BOS judged | doubled BOS | added BOS | missing BOS | BOS clean "
                "| token-identical cells |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, s in rows:
            t = s["tokens"]["template_counts"]
            out.append(f"| {name} | {t['templates']} | {t['bos_judged']} | {t['duplicated-bos']} | {t['added-bos']} "
                       f"| {t['missing-bos']} | {t['bos_clean']} | {t['cells_token_match']} of {t['cells_compared']} |")
        out.append("")
        for name, s in rows:
            for status, templates in s["tokens"]["bos"].items():
                if templates:
                    shown = ", ".join(f"`{t}`" for t in templates[:30])
                    more = f" and {len(templates) - 30} more" if len(templates) > 30 else ""
                    out.append(f"- **{name}** {status}: {shown}{more}")
        out.append("")
    return out


def html_section(report) -> str:
    """Per runner with template facts or token verdicts: one row per template."""
    from html import escape

    parts = []
    for name, s in report["runners"].items():
        facts = s.get("template_facts") or {}
        tokens = (s.get("tokens") or {}).get("templates", {})
        bos = (s.get("tokens") or {}).get("bos_by_template", {})
        if not facts and not tokens:
            continue
        basic = (s.get("basic") or {}).get("templates", {})
        head = ["template", "basic conversations"]
        ollama = any("ollama.route" in f for f in facts.values())
        if facts:
            head += (["Ollama route", "Go template", "distance"] if ollama
                     else ["built-in format", "detected by", "checked against the server"])
        if tokens:
            head += ["BOS", "token verdicts"]
        rows = []
        for template in sorted(set(facts) | set(tokens) | set(basic)):
            cells = [f'<td class="name">{escape(template)}</td>', f"<td>{escape(basic.get(template, '–'))}</td>"]
            if facts and ollama:
                f = facts.get(template, {})
                distance = f.get("ollama.distance")
                cells += [f'<td class="name">{escape(f.get("ollama.route", "–"))}</td>',
                          f'<td class="name">{escape(f.get("ollama.template") or "–")}</td>',
                          f'<td>{"–" if distance is None else distance}</td>']
            elif facts:
                f = facts.get(template, {})
                shown = f.get("builtin_format") or ("not recognised" if "builtin_format" in f else "–")
                cells += [f'<td class="name">{escape(shown)}</td>', f'<td class="name">{escape(f.get("rule", ""))}</td>',
                          f'<td class="name">{escape(f.get("server_check", ""))}</td>']
            if tokens:
                row_bos = ", ".join(f"{k} {v}" for k, v in sorted(bos.get(template, {}).items())) or "unknown"
                row = ", ".join(f"{k} {v}" for k, v in sorted(tokens.get(template, {}).items()))
                cells += [f'<td class="name">{escape(row_bos)}</td>', f'<td class="name">{escape(row)}</td>']
            rows.append("<tr>" + "".join(cells) + "</tr>")
        summary = []
        if s.get("basic") and s["basic"]["templates"]:
            summary.append("basic conversations: " + _basic_line(s["basic"]))
        if s.get("tokens"):
            summary.append("token parity: " + _token_line(s["tokens"]))
        parts.append(f'<h3>{escape(name)}</h3><p class="note">{escape("; ".join(summary))}</p>'
                     f'<details><summary>{len(rows)} template(s)</summary><table id="templates-{escape(name)}"><tr>'
                     + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table></details>")
    if not parts:
        return ""
    return ("<h2>Templates: engine decisions and token parity</h2><p class=\"note\">basic conversations: "
            + escape(", ".join(BASIC_CASES)) + "; token verdicts compare the tokens each engine feeds its model "
            "with what transformers' apply_chat_template(tokenize=True) feeds it.</p>" + "".join(parts))
