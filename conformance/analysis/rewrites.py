"""Portable rewrites of a chat template, each proven by rendering before it is kept (`chatgold compat --fix`).

A rewrite spells one construct in a way more engines render, tied to the known causes (engine baselines) it
answers. It is applied only inside the template's code (`{{ ... }}`, `{% ... %}`), never to its text, and kept
only when, rendered on every case: (1) the reference's bytes (or refusal) are unchanged on every case, and
(2) at least one selected engine renders more cases right and none renders fewer. Rewrites are tried one at a
time, each on top of those already kept.

    get-subscript        `x.get(k)` / `x.get(k, d)`  ->  `(x[k] if k in x else none)` / `(... else d)`
                         engines without dict `.get()` (TGI's MiniJinja: "unknown method") or without its
                         default argument (mistral.rs: "too many arguments")
    tojson-ensure-ascii  `|tojson(ensure_ascii=False)`  ->  `|tojson`: the reference's `tojson` never
                         escapes to ASCII, MiniJinja refuses the keyword
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

_CODE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
_PATH = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[(?:'[^'\[\]]*'|\"[^\"\[\]]*\"|[A-Za-z_]\w*|\d+)\])*"
_ARG = r"'[^'\\]*'|\"[^\"\\]*\"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|-?\d+(?:\.\d+)?|\{\}|\[\]|\([^()]*\)"
_GET = re.compile(rf"(?<![\w.\]])({_PATH})\.get\(\s*({_ARG})\s*(?:,\s*({_ARG})\s*)?\)")
_ENSURE = re.compile(r"(tojson\s*\([^()]*?)(?:,\s*ensure_ascii\s*=\s*False\b|\bensure_ascii\s*=\s*False\s*,?\s*)")


@dataclass(frozen=True)
class Rewrite:
    name: str
    what: str
    causes: tuple          # "engine:cause-id" it answers
    apply: Callable[[str], tuple]   # template -> (new template, sites rewritten)


def in_code(template: str, change: Callable[[str], tuple]) -> tuple:
    """Apply `change(code) -> (code, n)` to every `{{ }}` / `{% %}` span; (template, total sites)."""
    total = 0

    def one(match: re.Match) -> str:
        nonlocal total
        code, count = change(match.group(0))
        total += count
        return code
    return _CODE.sub(one, template), total


def _get_subscript(template: str) -> tuple:
    def change(code: str) -> tuple:
        total = 0
        for _ in range(8):  # inside out: `a.get(k, b.get(j))` once the inner call is spelled with parentheses
            code, count = _GET.subn(lambda m: f"({m.group(1)}[{m.group(2)}] if {m.group(2)} in {m.group(1)} else "
                                              f"{m.group(3) or 'none'})", code)
            total += count
            if not count:
                break
        return code, total
    return in_code(template, change)


def _tojson_ensure_ascii(template: str) -> tuple:
    def change(code: str) -> tuple:
        code, n = _ENSURE.subn(r"\1", code)
        return re.sub(r"tojson\s*\(\s*\)", "tojson", code), n
    return in_code(template, change)


REWRITES = (
    Rewrite("get-subscript", "`x.get(k, d)` spelled `(x[k] if k in x else d)`",
            ("tgi:c-a3eb7a9dad", "tgi:c-80744ccabe", "tgi:c-89f7610055", "tgi:c-37b9a67dd3",
             "mistralrs:c-0cc4d0b23c", "mistralrs:c-2aa0b006f5", "mistralrs:c-ad10fd6447",
             "mistralrs:c-c99060887a"), _get_subscript),
    Rewrite("tojson-ensure-ascii", "`|tojson(ensure_ascii=False)` spelled `|tojson` (the reference never escapes "
            "to ASCII in `tojson`)",
            ("minijinja:c-22c6d44278", "minijinja:c-0f5f5c8a41", "minijinja:c-1afa10836d",
             "minijinja:c-966d6ac604"), _tojson_ensure_ascii),
)


def right_counts(record: dict) -> dict:
    return {e["engine"]: e["counts"]["right"] for e in record["engines"]}


def prove(base: dict, candidate: dict) -> tuple:
    """(kept, gained per engine, why not) for a candidate's compat record against the current one."""
    if candidate["reference"]["digest"] != base["reference"]["digest"]:
        return False, {}, "the reference's bytes change on some case"
    before, after = right_counts(base), right_counts(candidate)
    gained = {engine: after[engine] - before[engine] for engine in before if after[engine] != before[engine]}
    if any(change < 0 for change in gained.values()):
        worse = ", ".join(f"{e} {g}" for e, g in sorted(gained.items()) if g < 0)
        return False, gained, f"an engine renders fewer cases right ({worse})"
    if not gained:
        return False, gained, "no engine renders more cases right"
    return True, gained, ""


def fix(text: str, base: dict, render: Callable[[str], dict]) -> tuple:
    """(fixed text, its compat record, fix section) trying every rewrite that applies; `render(text)` is the
    compat record of a template text (the same engines and cases as `base`)."""
    current, record = text, base
    applied, rejected = [], []
    pending = list(REWRITES)
    neutral: dict = {}   # name -> (rewrite, entry): the reference unchanged, no engine better or worse
    progress = True
    while progress and pending:
        # again after each kept rewrite: one that changed nothing alone may help once another is in
        progress = False
        for rewrite in list(pending):
            candidate, sites = rewrite.apply(current)
            if not sites or candidate == current:
                pending.remove(rewrite)
                continue
            entry = {"name": rewrite.name, "what": rewrite.what, "causes": list(rewrite.causes), "sites": sites}
            result = render(candidate)
            kept, gained, why = prove(record, result)
            entry["gained"] = gained
            if kept:
                applied.append(entry)
                current, record = candidate, result
                pending.remove(rewrite)
                neutral.pop(rewrite.name, None)
                progress = True
            elif not gained and result["reference"]["digest"] == record["reference"]["digest"]:
                neutral[rewrite.name] = (rewrite, {**entry, "why": why})
            else:
                rejected.append({**entry, "why": why})
                pending.remove(rewrite)
                neutral.pop(rewrite.name, None)
    neutral = list(neutral.values())
    if len(neutral) > 1:
        # Rewrites that each change nothing alone may be needed together (an engine refusing two constructs
        # of one template): the combination is proven the same way, as one candidate.
        candidate = current
        for rewrite, _ in neutral:
            candidate = rewrite.apply(candidate)[0]
        result = render(candidate)
        kept, gained, why = prove(record, result)
        if kept:
            applied += [{**entry, "gained": gained, "together": [r.name for r, _ in neutral]}
                        for _, entry in ((r, {k: v for k, v in e.items() if k != "why"}) for r, e in neutral)]
            current, record = candidate, result
            neutral = []
    rejected += [entry for _, entry in neutral]
    return current, record, {"applied": applied, "rejected": rejected, "before": right_counts(base),
                             "after": right_counts(record)}
