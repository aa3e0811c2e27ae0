"""What the template is given: a probe of a reproducer's data as each side hands it to the template.

A product's request layer rebuilds the request before its template runs (mistral.rs keeps a message's `role` and
`content` only; a one-part content list becomes its text). Each such rebuild shows through every template that
reads the data differently, so reducing the template alone files one bug under as many causes as there are
templates. The probe names the rebuild instead: one template, generated from the reproducer's own data, prints
for every path of it whether the template sees it and as what (undefined, none, a string, a mapping or a list and
its length, another value). Where the two sides' answers differ, the engine was given other data; a path so
given owns the reproducer's difference when taking it out of the data leaves none (causes.find_owners).

A trigger is written `seen:<path>=<change>`: the path as read_paths writes it (indices as `[]`), a dropped key
as `*` of its parent (every key dropped from a message is one rebuild), the change `dropped`, `added`,
`<type>><type>`, `length` (a list's) or `value` (a string not the request's).
"""
from __future__ import annotations

import json
from typing import Iterable, Optional

PREFIX = "seen:"
TOPS = ("messages", "tools", "documents")
MAX_PATHS = 96    # a reduced reproducer's data is small; a probe of a large case would only cost renders
MAX_DEPTH = 6
_KINDS = {"u": "undefined", "n": "none", "s": "string", "m": "mapping", "l": "list", "v": "value"}


def paths_of(case: dict) -> list:
    """(expression, concrete path, normalised path, guard, the request's value) for each value under the case's messages, tools and
    documents, parents before children, at most MAX_PATHS. The guard tests that every container above the
    value is, on this side, the container the request has there: indexing a list the engine was given as a
    string refuses in some engines, and the parent's own field already says it changed."""
    out: list = []

    def walk(value, expression: str, concrete: tuple, normal: str, depth: int, guard: tuple) -> None:
        if len(out) >= MAX_PATHS or depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            inner = guard + (f"{expression} is defined", f"{expression} is mapping")
            items = [(f"{expression}[{json.dumps(key)}]", key, f"{normal}.{key}", item)
                     for key, item in value.items() if isinstance(key, str)]
        elif isinstance(value, list):
            inner = guard + (f"{expression} is defined", f"{expression} is iterable", f"{expression} is not string",
                             f"{expression} is not mapping")
            items = [(f"{expression}[{index}]", index, f"{normal}[]", item) for index, item in enumerate(value)]
        else:
            return
        for child, step, child_normal, item in items:
            out.append((child, concrete + (step,), child_normal, inner, item))
            walk(item, child, concrete + (step,), child_normal, depth + 1, inner)

    for top in TOPS:
        value = case.get(top)
        if isinstance(value, list) and value:
            walk(value, top, (top,), top, 0, ())
    return out[:MAX_PATHS]


def _literal(text: str) -> Optional[str]:
    """A string as a template literal every engine reads alike, or None: only `"` and the backslash escaped,
    nothing else an engine might read otherwise (control characters)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return None
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def probe_template(paths: list) -> str:
    """The template that prints one field a path, `;`-separated: its kind (_KINDS); for a list its length, for
    a string whether it equals the request's (`s=` or `s!`; a length would be the engine's `length`, which may
    count UTF-16 units, not the data's); `x` where a container above it is not what the request has. Only
    tests every engine has (defined, none, string, mapping, iterable), `==` and the `length` filter."""
    fields = []
    for e, _, _, guard, value in paths:
        literal = _literal(value) if isinstance(value, str) else None
        text = f"s{{% if {e} == {literal} %}}={{% else %}}!{{% endif %}}" if literal is not None else "s"
        field = (f"{{% if {e} is not defined %}}u{{% elif {e} is none %}}n{{% elif {e} is string %}}{text}"
                 f"{{% elif {e} is mapping %}}m{{% elif {e} is iterable %}}l{{{{ {e}|length }}}}"
                 f"{{% else %}}v{{% endif %}}")
        if guard:
            field = f"{{% if {' and '.join(guard)} %}}{field}{{% else %}}x{{% endif %}}"
        fields.append(field + ";")
    return "".join(fields)


def _fields(text: str, count: int) -> Optional[list]:
    parts = text.split(";")
    if len(parts) != count + 1 or parts[-1] != "":
        return None
    return parts[:-1]


def changes(paths: list, reference_text: str, engine_text: str) -> list:
    """(trigger, concrete path) for each path the engine was given otherwise than the reference, the shallowest
    only (a dropped message explains its keys). [] when either answer is not the probe's shape."""
    ref, eng = _fields(reference_text, len(paths)), _fields(engine_text, len(paths))
    if ref is None or eng is None:
        return []
    out, covered = [], []
    for (_, concrete, normal, _, _), mine, theirs in zip(paths, ref, eng):
        if mine == theirs or "x" in (mine, theirs) or any(concrete[:len(c)] == c for c in covered):
            continue
        covered.append(concrete)
        if theirs == "u":
            change, normal = "dropped", normal.rsplit(".", 1)[0] + ".*" if isinstance(concrete[-1], str) else normal
        elif mine == "u":
            change = "added"
        elif mine[0] != theirs[0]:
            change = f"{_KINDS[mine[0]]}>{_KINDS[theirs[0]]}"
        else:
            change = "length" if mine[0] == "l" else "value"
        out.append((f"{PREFIX}{normal}={change}", concrete))
    return out


def without(case: dict, concretes: Iterable[tuple]) -> dict:
    """The case with each concrete path taken out (a key removed, a list item left out)."""
    out = json.loads(json.dumps(case))
    # deepest and last first, so that taking out one list item does not move another
    order = lambda c: (len(c), tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in c))  # noqa: E731
    for concrete in sorted(concretes, key=order, reverse=True):
        parent = out
        try:
            for step in concrete[:-1]:
                parent = parent[step]
            del parent[concrete[-1]]
        except (KeyError, IndexError, TypeError):
            continue
    return out


def is_seen(trigger: str) -> bool:
    return trigger.startswith(PREFIX)


_SAID = {"added": "`{path}` given to the template where the request has none",
         "length": "`{path}` given to the template with another length",
         "value": "`{path}` given to the template as another string"}


def subject(trigger: str) -> str:
    """How a title names a `seen:` trigger."""
    path, change = trigger[len(PREFIX):].rsplit("=", 1)
    if change == "dropped":
        return f"keys of `{path[:-2]}` dropped before the template runs" if path.endswith(".*") else \
            f"`{path}` dropped before the template runs"
    if change in _SAID:
        return _SAID[change].format(path=path)
    before, after = change.split(">")
    return f"`{path}` given to the template as a {after} where the request has a {before}"
