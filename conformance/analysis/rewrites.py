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
    iterable-not-none    `x is iterable`  ->  `(x is iterable and x is not none)`: MiniJinja counts none as
                         iterable (then `x|length` fails or a none is printed), jinja2 does not
    digit-subscript      `x.0.y`  ->  `x[0].y`: MiniJinja's lexer reads `.0.` as a float and the template
                         does not compile; jinja2 reads both as the item
    generation-exact     `{%- generation -%}`  ->  `{{- '' }}{% generation %}{{ '' -}}` (and `endgeneration`):
                         engines that drop the tag by its exact text (TGI, mistral.rs) find it; the empty
                         prints carry the whitespace control
    continue-as-if       `{% for %}..{% if c %}{% continue %}{% endif %}REST{% endfor %}`  ->
                         `{% for %}..{% if not (c) %}REST{% endif %}{% endfor %}`: builds without loop
                         controls (mistral.rs) refuse `continue`; llama.cpp drops what the `if` printed
    continue-flag        a `{% continue %}` ending any branch of such an `if`: a flag set there, the rest of
                         the body in `{% if not _cg_skip %}...{% endif %}`
    break-flag           a `{% break %}` ending a branch (of `if`s at any depth in a loop's body): a namespace
                         flag made before the loop, set there; the body and the rest of each block after the
                         `if` that broke guarded by it (mistral.rs, mistralrs-server, SGLang: no loop controls)
    string-for-index     `{% for x in m.content %}`  ->  a loop over `range(m.content|length)` when the content
                         is a string (x its character, as jinja2 walks it), over the content otherwise:
                         @huggingface/jinja's `for` refuses a string
    default-true         `x|default(d, true)`  ->  `(x if x else d)`: TGI's MiniJinja takes one argument
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


_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_OPERAND = rf"(?<![\w.\]|)'\"])({_PATH})"
_ITERABLE = re.compile(rf"{_OPERAND}\s+is\s+(not\s+)?iterable\b")
_DIGIT = re.compile(r"(?<=[A-Za-z_\]\)])\.(\d+)(?![\w.]*\()(?=\W|$)")
_DEFAULT_TRUE = re.compile(rf"{_OPERAND}\s*\|\s*default\(\s*({_ARG})\s*,\s*(?:true|True)\s*\)")
_GENERATION = re.compile(r"\{%(-?)\s*(generation|endgeneration)\s*(-?)%\}")
_TAG = re.compile(r"\{%(-?)\s*(\w+)(.*?)(-?)%\}", re.DOTALL)
# tags that open a block closed by `end<word>` (`set` without `=` too: a block set)
_OPENERS = ("for", "if", "macro", "call", "filter", "generation", "block", "with", "autoescape")
_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


def _tags(template: str) -> list:
    """The block tags of a template, those quoted inside a `{# comment #}` left out."""
    comments = [m.span() for m in _COMMENT.finditer(template)]
    return [t for t in _TAG.finditer(template) if not any(a <= t.start() < b for a, b in comments)]


def outside_strings(code: str, change: Callable[[str], tuple]) -> tuple:
    """Apply `change(piece) -> (piece, n)` to the parts of a code span outside its string literals."""
    out, total, at = [], 0, 0
    for literal in list(_STRING.finditer(code)) + [None]:
        end = literal.start() if literal else len(code)
        piece, count = change(code[at:end])
        out.append(piece)
        total += count
        if literal:
            out.append(literal.group(0))
            at = literal.end()
    return "".join(out), total


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


def _iterable_not_none(template: str) -> tuple:
    def piece(code: str) -> tuple:
        return _ITERABLE.subn(lambda m: (f"({m.group(1)} is not iterable or {m.group(1)} is none)" if m.group(2)
                                         else f"({m.group(1)} is iterable and {m.group(1)} is not none)"), code)
    return in_code(template, lambda code: outside_strings(code, piece))


def _digit_subscript(template: str) -> tuple:
    return in_code(template, lambda code: outside_strings(code, lambda p: _DIGIT.subn(r"[\1]", p)))


def _default_true(template: str) -> tuple:
    # the default is often a string literal, so the match spans literals (a filter call inside a literal is
    # not a thing templates print)
    return in_code(template, lambda code: _DEFAULT_TRUE.subn(
        lambda m: f"({m.group(1)} if {m.group(1)} else {m.group(2)})", code))


def _generation_exact(template: str) -> tuple:
    def one(m: re.Match) -> str:
        if m.group(0) == f"{{% {m.group(2)} %}}":
            return m.group(0)
        return ("{{- '' }}" if m.group(1) else "") + f"{{% {m.group(2)} %}}" + ("{{ '' -}}" if m.group(3) else "")
    text, total = template, 0
    out = _GENERATION.sub(one, text)
    total = sum(1 for m in _GENERATION.finditer(text) if m.group(0) != f"{{% {m.group(2)} %}}")
    return out, total


def _continue_as_if(template: str) -> tuple:
    """`{% if c %}{% continue %}{% endif %}` right inside a for loop's body: the rest of the body goes into
    `{% if not (c) %}...{% endif %}`, the new `if` taking the old `endif`'s right whitespace control and the new
    `endif` the `endfor`'s left one (so every byte around them is stripped or kept as before)."""
    tags = _tags(template)
    edits = []      # (start, end, replacement)
    stack = []      # [kind, tag index, inserts before its end]
    i = 0
    while i < len(tags):
        tag = tags[i]
        word = tag.group(2)
        if word in _OPENERS:
            if word == "if" and stack and stack[-1][0] == "for" and i + 2 < len(tags) \
                    and tags[i + 1].group(2) == "continue" and tags[i + 2].group(2) == "endif" \
                    and not template[tag.end():tags[i + 1].start()].strip() \
                    and not template[tags[i + 1].end():tags[i + 2].start()].strip():
                condition, right = tag.group(3).strip(), tags[i + 2].group(4)
                edits.append((tag.start(), tags[i + 2].end(), f"{{%{tag.group(1)} if not ({condition}) {right}%}}"))
                stack[-1][2] += 1
                i += 3
                continue
            stack.append([word, i, 0])
        elif word == "set" and "=" not in tag.group(3):
            stack.append(["set", i, 0])    # a block set, closed by endset
        elif word.startswith("end") and stack:
            kind, _, inserts = stack.pop()
            if kind == "for" and inserts:
                edits.append((tag.start(), tag.start(), f"{{%{tag.group(1)} endif %}}" * inserts))
        elif word == "else" and stack and stack[-1][0] == "for" and stack[-1][2]:
            return template, 0    # a for loop's else: where the new endif goes is not this simple
        i += 1
    if stack:
        return template, 0        # unbalanced tags: leave the template alone
    for start, end, replacement in sorted(edits, reverse=True):
        template = template[:start] + replacement + template[end:]
    return template, sum(1 for e in edits if e[0] != e[1])


def _continue_flag(template: str) -> tuple:
    """`{% continue %}` ending a branch of an `if` right inside a for loop's body: a flag set there instead
    (`_cg_skip`, false at the top of each iteration) and the rest of the body, after the `if`'s `endif`, in
    `{% if not _cg_skip %}...{% endif %}`; each new tag takes the whitespace control of the tag it stands
    next to, so the bytes around it are stripped or kept as before (jinja2's `if` has no scope of its own)."""
    tags = _tags(template)
    edits = []      # (at, end, replacement)
    stack = []      # [kind, tag, {"flag": bool, "wraps": int}]
    for i, tag in enumerate(tags):
        word = tag.group(2)
        nxt = tags[i + 1] if i + 1 < len(tags) else None
        if word in _OPENERS or (word == "set" and "=" not in tag.group(3)):
            stack.append([word, tag, {"flag": False, "wraps": 0, "skips": False}])
        elif word == "continue":
            if len(stack) < 2 or stack[-1][0] != "if" or stack[-2][0] != "for" or nxt is None \
                    or nxt.group(2) not in ("elif", "else", "endif") or template[tag.end():nxt.start()].strip():
                return template, 0    # a continue elsewhere: not this simple
            # `-%}`: the whitespace up to the branch's end is text the continue never let print
            edits.append((tag.start(), tag.end(), f"{{%{tag.group(1)} set _cg_skip = true -%}}"))
            stack[-1][2]["skips"] = True
        elif word.startswith("end") and stack:
            kind, opened, info = stack.pop()
            if kind == "if" and info["skips"]:
                loop = stack[-1]
                if not loop[2]["flag"]:
                    loop[2]["flag"] = True
                    edits.append((loop[1].end(), loop[1].end(), f"{{% set _cg_skip = false {loop[1].group(4)}%}}"))
                edits.append((tag.end(), tag.end(), f"{{% if not _cg_skip {tag.group(4)}%}}"))
                loop[2]["wraps"] += 1
            if kind == "for" and info["wraps"]:
                edits.append((tag.start(), tag.start(), f"{{%{tag.group(1)} endif %}}" * info["wraps"]))
        elif word == "else" and stack and stack[-1][0] == "for" and stack[-1][2]["wraps"]:
            return template, 0
    if stack:
        return template, 0
    # insertions at one place go in the order they were made (`{% endif %}{% endfor %}`: the guard opens, then
    # closes)
    return _applied(template, edits), sum(1 for e in edits if "set _cg_skip = true" in e[2])


def _break_flag(template: str) -> tuple:
    """`{% break %}` ending a branch (of an `if` at any depth in a for loop's body, or the body itself): a
    namespace flag made just before the loop (`_cg_break<n>`, a namespace because jinja2 forgets a plain `set` at
    the next iteration), set where the break was; the whole body in `{% if not <flag>.on %}` (the iterations
    after a break print nothing), and the rest of each enclosing block after the `if` that broke in
    `{% if not <flag>.on %}...{% endif %}` (the rest of the iteration prints nothing). Each new tag takes the
    whitespace control of the tag it stands next to; the set strips what follows it up to the branch's end,
    text the break never let print. A loop with an `else`, a filter (`for x in y if c`, evaluated for every
    item, also those after the break) or `recursive` is left alone, as is a break anywhere else."""
    tags = _tags(template)
    edits = []      # (at, end, replacement)
    stack = []      # [kind, tag, {"flag": name or None, "guards": int, "breaks": set of flag names}]
    loops = 0
    for i, tag in enumerate(tags):
        word = tag.group(2)
        nxt = tags[i + 1] if i + 1 < len(tags) else None
        if word in _OPENERS or (word == "set" and "=" not in tag.group(3)):
            stack.append([word, tag, {"flag": None, "guards": 0, "breaks": set()}])
        elif word == "break":
            loop = next((at for at in range(len(stack) - 1, -1, -1) if stack[at][0] != "if"), None)
            if loop is None or stack[loop][0] != "for" or nxt is None \
                    or nxt.group(2) not in (("elif", "else", "endif") if stack[-1][0] == "if" else ("endfor",)) \
                    or template[tag.end():nxt.start()].strip():
                return template, 0    # a break elsewhere: not this simple
            head = stack[loop][1]
            if re.search(r"\b(?:if|recursive)\b", _STRING.sub("''", head.group(3))):
                return template, 0
            info = stack[loop][2]
            if info["flag"] is None:
                info["flag"] = f"_cg_break{loops}"
                loops += 1
                edits.append((head.start(), head.start(),
                              f"{{%{head.group(1)} set {info['flag']} = namespace(on=false) %}}"))
                edits.append((head.end(), head.end(), f"{{% if not {info['flag']}.on {head.group(4)}%}}"))
            edits.append((tag.start(), tag.end(), f"{{%{tag.group(1)} set {info['flag']}.on = true -%}}"))
            if stack[-1][0] == "if":
                stack[-1][2]["breaks"].add(info["flag"])
        elif word in ("elif", "else", "endif", "endfor") or (word.startswith("end") and stack):
            if not stack:
                return template, 0
            if word in ("elif", "else"):
                kind, opened, info = stack[-1]
                if kind == "for" and info["flag"]:
                    return template, 0    # a for loop's else
                if info["guards"]:
                    edits.append((tag.start(), tag.start(), f"{{%{tag.group(1)} endif %}}" * info["guards"]))
                    info["guards"] = 0
                continue
            kind, opened, info = stack.pop()
            if info["guards"]:
                edits.append((tag.start(), tag.start(), f"{{%{tag.group(1)} endif %}}" * info["guards"]))
            if kind == "for" and info["flag"]:
                edits.append((tag.start(), tag.start(), f"{{%{tag.group(1)} endif %}}"))
            if kind == "if" and info["breaks"]:
                parent = stack[-1]    # an if's breaks always have a loop around them
                for flag in sorted(info["breaks"]):
                    edits.append((tag.end(), tag.end(), f"{{% if not {flag}.on {tag.group(4)}%}}"))
                    parent[2]["guards"] += 1
                    if parent[0] == "if":     # its own endif then guards the rest of the block around it
                        parent[2]["breaks"].add(flag)
    if stack:
        return template, 0
    # insertions at one place go in the order they were made (a guard opened before the next one closes)
    return _applied(template, edits), sum(1 for e in edits if ".on = true" in e[2])


_CONTENT_LOOP = re.compile(rf"\s*([A-Za-z_]\w*)\s+in\s+"
                           rf"((?:{_PATH})?(?:\bcontent|\.content|\[(?:'content'|\"content\")\]))\s*$")


def _string_for_index(template: str) -> tuple:
    """`{% for x in m.content %}` (a message's content, a string or a list of parts): the loop runs over
    `(range(m.content|length) if m.content is string else m.content)` and its body starts with
    `{% set x = (m.content[i] if m.content is string else i) %}`, so a string is still walked character by
    character, as jinja2 does, in engines whose `for` refuses a string (@huggingface/jinja); a list or a map
    is walked as before. The loop's `loop` is the same (same length); a template reading `loop.previtem` or
    `loop.nextitem` (an index, not a character, on a string) is left alone, as is a loop with a filter or
    `recursive`. Each new tag takes the old tag's whitespace control."""
    if re.search(r"\bloop\.(?:previtem|nextitem)\b", template):
        return template, 0
    edits = []
    for tag in _tags(template):
        if tag.group(2) != "for":
            continue
        head = _CONTENT_LOOP.fullmatch(tag.group(3))
        if head is None:
            continue
        target, items = head.group(1), head.group(2)
        index = f"_cg_i{len(edits)}"
        edits.append((tag.start(), tag.end(),
                      f"{{%{tag.group(1)} for {index} in (range({items}|length) if {items} is string else {items}) "
                      f"{tag.group(4)}%}}{{% set {target} = ({items}[{index}] if {items} is string else {index}) "
                      f"{tag.group(4)}%}}"))
    for at, end, replacement in reversed(edits):
        template = template[:at] + replacement + template[end:]
    return template, len(edits)


def _applied(template: str, edits: list) -> str:
    """The template with (start, end, replacement) edits made from the last place back; edits at one place keep
    the order they were listed in."""
    order = sorted(range(len(edits)), key=lambda n: (edits[n][0], edits[n][1], n), reverse=True)
    for at, end, replacement in (edits[n] for n in order):
        template = template[:at] + replacement + template[end:]
    return template


REWRITES = (
    Rewrite("get-subscript", "`x.get(k, d)` spelled `(x[k] if k in x else d)`",
            ("tgi:c-a3eb7a9dad", "mistralrs:c-0cc4d0b23c", "mistralrs-server:c-0cc4d0b23c"), _get_subscript),
    Rewrite("tojson-ensure-ascii", "`|tojson(ensure_ascii=False)` spelled `|tojson` (the reference never escapes "
            "to ASCII in `tojson`)",
            ("minijinja:c-56d7b3763b",), _tojson_ensure_ascii),
    Rewrite("iterable-not-none", "`x is iterable` spelled `(x is iterable and x is not none)` (none is iterable in "
            "MiniJinja, not in jinja2)",
            ("minijinja:c-c7e0a60672", "minijinja:c-2958e4a0e2", "tgi:c-c7e0a60672",
             "mistralrs:c-4a0d57a5eb", "mistralrs-server:c-b2e4a16d26", "ferrox:c-ef6c32820d",
             "ferrox:c-2958e4a0e2"), _iterable_not_none),
    Rewrite("digit-subscript", "`x.0.y` spelled `x[0].y` (MiniJinja's lexer reads `.0.` as a float)",
            ("tgi:c-dbf62c46d1", "mistralrs:c-dbf62c46d1", "mistralrs-server:c-dbf62c46d1"), _digit_subscript),
    Rewrite("generation-exact", "`{%- generation -%}` spelled `{{- '' }}{% generation %}{{ '' -}}` (engines drop "
            "the tag by its exact text; the empty prints keep the whitespace control)",
            ("tgi:c-9ca88f1462", "tgi:c-c1fc9e0c4a"), _generation_exact),
    Rewrite("continue-as-if", "`{% if c %}{% continue %}{% endif %}REST` in a loop spelled `{% if not (c) %}REST"
            "{% endif %}` (no loop controls needed)",
            ("mistralrs:c-c51266d765", "mistralrs:c-a4714d7fa8", "mistralrs-server:c-c51266d765",
             "mistralrs-server:c-a4714d7fa8", "llamacpp:c-79c62c7784",
             "hfjs:c-79c62c7784"), _continue_as_if),
    Rewrite("continue-flag", "`{% continue %}` ending an `if` branch in a loop spelled as a flag and "
            "`{% if not _cg_skip %}REST{% endif %}` (no loop controls needed)",
            ("mistralrs:c-c51266d765", "mistralrs:c-a4714d7fa8", "mistralrs-server:c-c51266d765",
             "mistralrs-server:c-a4714d7fa8", "llamacpp:c-79c62c7784",
             "hfjs:c-79c62c7784"), _continue_flag),
    Rewrite("break-flag", "`{% break %}` ending a branch in a loop spelled as a namespace flag set there, the "
            "body in `{% if not <flag>.on %}` and the rest of the iteration after the break's `if` guarded by it "
            "(no loop controls needed)",
            ("mistralrs:c-4d66ebe78f", "mistralrs-server:c-4d66ebe78f", "sglang:c-4d66ebe78f"), _break_flag),
    Rewrite("string-for-index", "`{% for x in m.content %}` spelled as a loop over `range(m.content|length)` when "
            "the content is a string (its characters, as jinja2 walks it), over the content as before otherwise",
            ("hfjs:c-3b08bf566c",), _string_for_index),
    Rewrite("default-true", "`x|default(d, true)` spelled `(x if x else d)` (TGI's MiniJinja takes one argument)",
            ("tgi:c-7a84c4d907",), _default_true),
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


def fix(text: str, base: dict, render: Callable[[str], dict], rewrites: tuple = REWRITES) -> tuple:
    """(fixed text, its compat record, fix section) trying every rewrite (of `rewrites`) that applies;
    `render(text)` is the compat record of a template text (the same engines and cases as `base`)."""
    current, record = text, base
    applied, rejected = [], []
    pending = list(rewrites)
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


def corpus_count(engines: list, check_run: Callable, explain_options: Callable, seed: int = 34, limit=None,
                 out=None, part: tuple = (1, 1), only: tuple = ()) -> dict:
    """`--fix` over the corpus: every template the rewrites apply to (at least one site), in a seeded random
    order (so a run cut short is a random sample), through compat with `engines`; one JSON line per template
    to `out` as it goes; `part` (I, N): the I-th of N interleaved parts; `only` (rewrite names): the templates
    where one of them has a site, and only they are tried. Returns the totals over the templates done.
    check_run / explain_options as compat takes them (the caller hands in conformance.checkrun's, a floor
    above this one)."""
    import json
    import random

    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.corpus.manifest import load_corpus

    rewrites = tuple(r for r in REWRITES if r.name in only) if only else REWRITES
    unknown = set(only) - {r.name for r in REWRITES}
    if unknown:
        raise ValueError(f"unknown rewrite(s): {', '.join(sorted(unknown))}")
    entries = sorted(load_corpus().by_id.values(), key=lambda e: e.id)
    applicable = [e for e in entries if any(r.apply(e.source())[1] for r in rewrites)]
    random.Random(seed).shuffle(applicable)
    index, count = part  # every count-th template from the index-th: parts run apart add up to the whole
    applicable = applicable[index - 1::count]
    options = CompatOptions(engines=list(engines), workers=1)
    totals = {"templates": len(entries), "applicable": len(applicable), "done": 0, "kept": 0, "pairs": 0, "cells": 0}
    for entry in applicable[:limit]:
        def render(text: str, entry=entry) -> dict:
            return compat(UserTemplate(entry.id, text, entry.bos_token, entry.eos_token), options, check_run,
                          explain_options)
        _, _, section = fix(entry.source(), render(entry.source()), render, rewrites)
        gains = {e: section["after"][e] - section["before"][e] for e in section["before"]}
        totals["done"] += 1
        totals["kept"] += bool(section["applied"])
        totals["pairs"] += sum(1 for g in gains.values() if g > 0)
        totals["cells"] += sum(g for g in gains.values() if g > 0)
        if out is not None:
            out.write(json.dumps({"template": entry.id, "applied": [a["name"] for a in section["applied"]],
                                  "gained": {e: g for e, g in gains.items() if g},
                                  "rejected": {r["name"]: r["why"] for r in section["rejected"]}}) + "\n")
            out.flush()
    return totals

