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
        if isinstance(value, list):
            # the list itself too: a request layer may drop an empty `tools` or merge messages
            out.append((top, (top,), top, (), value))
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
            keyed = isinstance(concrete[-1], str) and len(concrete) > 1
            change, normal = "dropped", normal.rsplit(".", 1)[0] + ".*" if keyed else normal
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
        if concrete == ("messages",):
            continue   # every request has its messages: a list of another length is shown by other owners
        parent = out
        try:
            for step in concrete[:-1]:
                parent = parent[step]
            del parent[concrete[-1]]
        except (KeyError, IndexError, TypeError):
            continue
    return out


_ABSENT = object()


def _at(value, steps: Iterable):
    """The value at `steps` (keys and indices) under `value`, or _ABSENT where the path does not lead."""
    try:
        for step in steps:
            value = value[step]
    except (KeyError, IndexError, TypeError):
        return _ABSENT
    return value


MAX_ORDERED = 24   # mappings an order probe looks at
ORDER = PREFIX + "*=order"

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def ordered_paths(paths: list) -> list:
    """The paths (paths_of) holding a mapping of 2 to 26 keys, every key a literal (_literal): those whose key
    order a request layer may change (a tool schema rebuilt through a typed struct prints its fields in the
    struct's order)."""
    out = []
    for path in paths:
        value = path[4]
        if isinstance(value, dict) and 2 <= len(value) <= len(_LETTERS) and \
                all(isinstance(key, str) and _literal(key) is not None for key in value):
            out.append(path)
    return out[:MAX_ORDERED]


def order_template(paths: list) -> str:
    """The template that prints, for each mapping of `paths` (ordered_paths), the request's position of each
    key in the order the template is given them (a letter a key, `?` for one the request lacks), `;`-separated.
    Apart from the first probe: an engine that cannot loop over a mapping refuses this one only."""
    fields = []
    for e, _, _, guard, value in paths:
        tests = "".join(f"{{% {'if' if i == 0 else 'elif'} k == {_literal(key)} %}}{_LETTERS[i]}"
                        for i, key in enumerate(value))
        field = f"{{% for k in {e} %}}{tests}{{% else %}}?{{% endif %}}{{% endfor %}}"
        guard = guard + (f"{e} is defined", f"{e} is mapping")
        fields.append(f"{{% if {' and '.join(guard)} %}}{field}{{% else %}}x{{% endif %}};")
    return "".join(fields)


def order_changes(paths: list, reference_text: str, engine_text: str) -> list:
    """(trigger, concrete path, the keys in the engine's order) for each mapping the engine was given the same
    keys of in another order, while the reference was given the request's."""
    ref, eng = _fields(reference_text, len(paths)), _fields(engine_text, len(paths))
    if ref is None or eng is None:
        return []
    out = []
    for (_, concrete, normal, _, value), mine, theirs in zip(paths, ref, eng):
        keys = list(value)
        if mine != _LETTERS[:len(keys)] or theirs == mine or sorted(theirs) != sorted(mine):
            continue
        # one trigger for every mapping: a request layer that does not keep key order (a JSON value type
        # without it, a typed struct) reorders whichever mappings it rebuilds, and that is one bug
        out.append((ORDER, concrete, [keys[_LETTERS.index(c)] for c in theirs]))
    return out


def reordered(case: dict, changes: Iterable[tuple]) -> dict:
    """The case with each mapping of `changes` (order_changes) rebuilt in the engine's key order."""
    out = json.loads(json.dumps(case))
    for _, concrete, keys in sorted(changes, key=lambda change: len(change[1])):
        parent = _at(out, concrete[:-1])
        mapping = parent[concrete[-1]]
        parent[concrete[-1]] = {key: mapping[key] for key in keys}
    return out


JOINS = ("", " ", "\n")


def joined(case: dict, concrete: tuple) -> list:
    """The case with the list at `concrete` given as the text of its parts, joined each way a request layer
    joins them (JOINS): what a `list>string` change may have made of it. [] when it holds anything but text."""
    value = _at(case, concrete)
    if not isinstance(value, list):
        return []
    texts = [part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
             for part in value]
    if any(not isinstance(text, str) for text in texts):
        return []
    joins = JOINS if len(texts) > 1 else JOINS[:1]
    return [with_values(case, [(concrete, join.join(texts))]) for join in joins]


ADDED_CONTENT = PREFIX + "messages[].content=added"


def absent_contents(case: dict) -> list:
    """(expression, concrete path) of each message's `content` the request does not have (a tool-call message
    has none): a request layer may fill it in (TGI writes the tool calls there as JSON), which no path of
    paths_of can show, since the request holds nothing there."""
    messages = case.get("messages")
    if not isinstance(messages, list):
        return []
    return [(f"messages[{index}][\"content\"]", ("messages", index, "content"))
            for index, message in enumerate(messages) if isinstance(message, dict) and "content" not in message]


def added_template(expression: str) -> str:
    """The template that prints `u` when the expression is undefined, `s` and the string when it is one, `o`
    otherwise."""
    return (f"{{% if {expression} is not defined %}}u{{% elif {expression} is string %}}s{{{{ {expression} }}}}"
            f"{{% else %}}o{{% endif %}}")


def with_values(case: dict, values: Iterable[tuple]) -> dict:
    """The case with each (concrete path, value) set."""
    out = json.loads(json.dumps(case))
    for concrete, value in values:
        _at(out, concrete[:-1])[concrete[-1]] = value
    return out


def as_text_messages(case: dict, values: Iterable[tuple]) -> dict:
    """The case with each message that a (concrete path, value) of `values` names kept as its role and content
    only."""
    out = json.loads(json.dumps(case))
    for concrete, _ in values:
        message = out["messages"][concrete[1]]
        out["messages"][concrete[1]] = {key: message[key] for key in ("role", "content") if key in message}
    return out


def null_kept(case: dict, concrete: tuple) -> Optional[str]:
    """The null trigger (cluster.triggers' `<top>.*=null`) of a path the request holds as null, or None."""
    if _at(case, concrete) is not None:
        return None
    return concrete[0] + ".*" * sum(isinstance(step, str) for step in concrete[1:]) + "=null"


USUAL_ROLES = frozenset({"", "user", "assistant", "system"})


def role_rewritten(case: dict, concrete: tuple) -> Optional[str]:
    """The role trigger (cluster.triggers' `role=<role>`) of a message role other than the usual ones that the
    engine was given as another string, or None: the engine rewriting a `developer` role is one cause whether
    the template then prints it, branches on it or refuses."""
    if len(concrete) != 3 or concrete[0] != "messages" or concrete[2] != "role":
        return None
    value = _at(case, concrete)
    return f"role={value}" if isinstance(value, str) and value not in USUAL_ROLES else None


def is_seen(trigger: str) -> bool:
    return trigger.startswith(PREFIX)


_SAID = {"added": "`{path}` given to the template where the request has none",
         "length": "`{path}` given to the template with another length",
         "value": "`{path}` given to the template as another string"}


def subject(trigger: str) -> str:
    """How a title names a `seen:` trigger."""
    if trigger == ORDER:
        return "the request's mappings given to the template with their keys in another order"
    path, change = trigger[len(PREFIX):].rsplit("=", 1)
    if change == "dropped":
        return f"keys of `{path[:-2]}` dropped before the template runs" if path.endswith(".*") else \
            f"`{path}` dropped before the template runs"
    if change in _SAID:
        return _SAID[change].format(path=path)
    before, after = change.split(">")
    return f"`{path}` given to the template as a {after} where the request has a {before}"
