"""Causes: reproducers clustered into root causes, with stable ids, short titles and a ranking.

A root cause is identified by its normalised minimal reproducer: the constructs of the reduced template that
do more than carry data to the point of difference (its culprits), and the kind of difference. Constructs
are named as the evaluator's inventory names them (runners/evaluator/inventory.py). Carriers (loops,
conditions, `set`, `namespace()`, subscripts and attributes, `.items()`/`|items`, `range()`, whitespace
control, operators, literals, variables) are left out of the key, so `{{ x|tojson }}` reached through a loop or a
subscript is one cause, and a difference in how a *value* prints (a null, a float) reached through any of
them is one cause. The kind of difference:
  - refusals (engine-raised, raised-differently): the engine's normalised refusal, so one bug that makes the
    engine refuse where the reference renders *and* where the reference refuses for another reason is one
    cause;
  - engine-rendered: the reference's normalised refusal that the engine lacks;
  - diverged: the class of the reduced pair's difference (whitespace and its direction, order, letter case,
    quotes, omitted, added or other text), with the reduced pair's normalised edits for the classes whose
    edits name what differs (omitted, added, other text, letter case, quotes).

The key depends on one reproducer only, so a cause's id (a hash of its key) is the same whichever cells of
the corpus are explained: a baseline's known causes stay known across selections.
"""
from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Callable, Iterable, NamedTuple, Optional

from conformance.explain import seen
from conformance.explain.signature import (
    Symptom,
    first_line,
    normalise_text,
    raw_edits,
)
from conformance.files import ENCODING_ERRORS
from conformance.judge.status import Status
from runners.base import Outcome
from runners.semantics import alias_reasoning

# `{% set k, v = ... %}` carries too: it is also what the reducer makes of `{% for k, v in ... %}` (its first
# item), so as a culprit it would name a construct the template never had.
CARRIERS = frozenset({"stmt:for", "stmt:if", "stmt:elif", "stmt:else", "stmt:set", "stmt:set-namespace",
                      "stmt:set-multiple",
                      "stmt:with", "global:namespace", "global:range", "method:items", "filter:items",
                      "op:subscript", "op:attr", "op:slice", "syntax:comment", "call:other"})
# `shown:NAME` marks a construct rendering showed misbehaving alone (isolate.py): no construct of the template.
CARRIER_FAMILIES = ("var:", "literal:", "ws:", "expr:", "op:", "shown:")
EDIT_LIMIT = 40   # characters of each side of an edit kept in a key


# Operators that are more than a way to reach data: a slice with a step (`[::-1]`) is its own feature, one that
# engines add late or not at all, where `messages[1:]` only carries the messages.
OWN_OPS = frozenset({"op:slice-step"})


def _stepped_slice(template: str) -> bool:
    from jinja2 import nodes

    from conformance.explain.template import _env

    # the reference's parser: a plain one refuses `{% generation %}`, and the whole construct list would go
    return any(node.step is not None for node in _env().parse(template).find_all(nodes.Slice))


def constructs_of(template: str) -> list:
    """Every construct the template uses (inventory names), variables left out, plus `op:slice-step` for a
    slice with a step; [] when it does not parse."""
    return list(_constructs(template))


@lru_cache(maxsize=4096)
def _constructs(template: str) -> tuple:
    # Parsed once a template: every runner's explain stage asks of the same reproducers and templates.
    try:
        from runners.evaluator.inventory import inventory

        names = inventory(template).names()
        stepped = "op:slice" in names and _stepped_slice(template)
    except Exception:  # a template that does not parse (the reference's compile error is the symptom)
        return ()
    # a carriage return in the template's own text: engines differ in whether they read it as a newline
    # (Jinja2 turns `\r\n` and `\r` into `\n`)
    carriage = ("text:carriage-return",) if "\r" in template else ()
    return tuple(n for n in names if not n.startswith("var:")) + (("op:slice-step",) if stepped else ()) + carriage


def _path(node, scope: dict):
    """The data path an expression reads (`messages.content`, `tools[].function`), loop and `set` names resolved
    through `scope`; None when it reads none (a literal, an operator's result)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Name):
        return scope.get(node.name, node.name)
    if isinstance(node, nodes.Getattr):
        base = _path(node.node, scope)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, nodes.Getitem):
        base = _path(node.node, scope)
        if base is None:
            return None
        if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            return f"{base}.{node.arg.value}"
        return base if base.endswith("[]") else base + "[]"
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        # `x.get('k')` reads x.k; `x.items()`, `x.strip()` read x (the method is a construct of its own)
        base = _path(node.node.node, scope)
        if base is not None and node.node.attr == "get" and node.args and isinstance(node.args[0], nodes.Const):
            return f"{base}.{node.args[0].value}"
        return base
    if isinstance(node, nodes.Filter) and node.node is not None:
        return _path(node.node, scope)
    return None


def _root(node) -> Optional[str]:
    """The name an attribute, index or method chain starts from (`tools` of `tools[0].function`)."""
    from jinja2 import nodes

    while isinstance(node, (nodes.Getattr, nodes.Getitem, nodes.Call, nodes.Filter)):
        node = node.node
    return node.name if isinstance(node, nodes.Name) else None


def _data_keys(case: dict) -> set:
    """Every mapping key the case's data holds (message, tool and kwarg keys, at any depth)."""
    keys: set = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                keys.add(str(key))
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for name in ("messages", "tools", "documents", "kwargs"):
        walk(case.get(name))
    return keys


# The names every request gives a template (the conversation's fields); its kwargs are the case's own.
REQUEST_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def read_paths(template: str, case: Optional[dict] = None, maybe_data: bool = False) -> list:
    """The data paths a template reads, normalised: loop and `set` names resolved to what they range over or
    hold (`for m in messages` -> `messages[]`), indices and slices as `[]`, literals left out, and a key the
    case's data holds written `*` (which key holds the value is the data's: one bug reached through `content`
    or `name` is one bug), while a name the data lacks is kept (`thinking`, `bos_token`: the template asks the
    engine for it). `"k" in x` reads x.k. Only the longest paths are kept; [] when the template does not parse.
    A name only some branches of an `if` bind is read as bound (a reproducer's data takes the branch it needs);
    with `maybe_data`, as the request's own name too (`{% if not tools is defined %}{% set tools = none %}`
    leaves `tools` the request's when it is given): every name a template may read."""
    from jinja2 import nodes

    from conformance.explain.template import parsed

    tree = parsed(template)
    if tree is None:
        return []
    scope: dict = {}
    maybe: set = set()   # names only some branches of an `if` bind
    found: set = set()
    given = REQUEST_NAMES | set((case or {}).get("kwargs") or {})
    macros: dict = {}       # name -> its definition, to read through at a call
    expanding: set = set()  # the macros read through at the moment (a recursive macro is read once)

    def bind(target, path) -> None:
        if isinstance(target, nodes.Name):
            scope[target.name] = path
        elif isinstance(target, nodes.Tuple):
            for item in target.items:
                bind(item, path)

    def visit_scoped(children) -> None:
        # a loop's or macro's body is a scope of its own: what it binds (its target, its arguments, its `set`s)
        # does not outlive it, so a macro argument named `tools` does not hide the global `tools` read elsewhere
        saved = dict(scope)
        for child in children:
            visit(child)
        scope.clear()
        scope.update(saved)

    def visit(node) -> None:
        if isinstance(node, nodes.For):
            visit(node.iter)
            base = _path(node.iter, scope)
            saved = dict(scope)
            # a loop over a literal binds template-local names: reading them reads no data
            bind(node.target, None if base is None else base if base.endswith("[]") else base + "[]")
            visit_scoped(node.body + ([node.test] if node.test is not None else []))
            scope.clear()
            scope.update(saved)
            visit_scoped(node.else_)
            return
        if isinstance(node, nodes.If):
            visit(node.test)
            before = dict(scope)
            after = []
            for branch in [node.body] + [[elif_] for elif_ in node.elif_] + [node.else_]:
                scope.clear()
                scope.update(before)
                for child in branch:
                    visit(child)
                after.append(dict(scope))
            scope.clear()
            for name in set().union(*after):
                bound = [branch[name] for branch in after if name in branch]
                # bound to data in some branch: what it is read as may be that data
                scope[name] = next((path for path in bound if path is not None), None)
                if len(bound) < len(after) and name not in before:
                    maybe.add(name)
            return
        if isinstance(node, nodes.Assign):
            visit(node.node)
            bind(node.target, _path(node.node, scope))  # None: a template-local value, not data
            return
        if isinstance(node, nodes.AssignBlock):
            bind(node.target, None)  # `{% set x %}...{% endset %}`: text the template makes
            for child in node.body:
                visit(child)
            return
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Name) and node.arg.name not in scope:
            # `x[name]` with a name nothing binds: an index (undefined on both sides), not data the engine binds
            visit(node.node)
            path = _path(node, scope)
            if path is not None:
                found.add(path)
            return
        if isinstance(node, (nodes.Macro, nodes.CallBlock)):
            # a macro's name and arguments are the template's own names, not data it reads
            if isinstance(node, nodes.Macro):
                scope[node.name] = None
                macros[node.name] = node
            for child in node.defaults + ([node.call] if isinstance(node, nodes.CallBlock) else []):
                visit(child)
            saved = dict(scope)
            for argument in node.args:
                bind(argument, None)
            visit_scoped(node.body)
            scope.clear()
            scope.update(saved)
            return
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name):
            # a function (`namespace()`, `raise_exception()`, a macro): only its arguments can read data, and a
            # bare name nothing binds passed to it is undefined on both sides, unless it is a name the request
            # gives (`render_tools(tools)`)
            passed = []
            for child in list(node.args) + [kw.value for kw in node.kwargs] + \
                    [arg for arg in (node.dyn_args, node.dyn_kwargs) if arg is not None]:
                if not (isinstance(child, nodes.Name) and child.name not in scope and child.name not in given):
                    visit(child)
                    passed.append(child)
            macro = macros.get(node.node.name)
            if macro is not None and macro.name not in expanding:
                # what a macro reads of the data passed to it is read through the call: `m(tools[0])` with
                # `{{ v.function }}` in m reads tools[].function, as `{% set v = tools[0] %}` would (a request's
                # name passed whole, `render(tools)`, stays read as that name)
                def into(value) -> bool:
                    return any(value is p for p in passed) and \
                        not (isinstance(value, nodes.Name) and value.name not in scope)

                bound = {argument.name: _path(value, scope) for argument, value in zip(macro.args, node.args)
                         if into(value)}
                bound.update({kw.key: _path(kw.value, scope) for kw in node.kwargs if into(kw.value)})
                bound = {name: path for name, path in bound.items() if path is not None}
                if bound:
                    saved = dict(scope)
                    for argument in macro.args:
                        bind(argument, None)
                    scope.update(bound)
                    expanding.add(macro.name)
                    visit_scoped(macro.body)
                    expanding.discard(macro.name)
                    scope.clear()
                    scope.update(saved)
            return
        if isinstance(node, nodes.Compare) and len(node.ops) == 1 and node.ops[0].op in ("in", "notin") \
                and isinstance(node.expr, nodes.Const) and isinstance(node.expr.value, str):
            base = _path(node.ops[0].expr, scope)
            if base is not None:
                found.add(f"{base}.{node.expr.value}")
        if isinstance(node, (nodes.Name, nodes.Getattr, nodes.Getitem, nodes.Call)):
            path = _path(node, scope)
            if path is not None and not (isinstance(node, nodes.Name) and node.ctx != "load"):
                found.add(path)
            root = _root(node)
            if maybe_data and root in maybe and not (isinstance(node, nodes.Name) and node.ctx != "load"):
                own = _path(node, {k: v for k, v in scope.items() if k != root})
                if own is not None:
                    found.add(own)
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            # a method's name is no path (`x.get`): visit what it is called on and its arguments
            for child in [node.node.node] + list(node.args) + [kw.value for kw in node.kwargs]:
                visit(child)
            return
        for child in node.iter_child_nodes():
            visit(child)

    visit(tree)
    keys = _data_keys(case or {})
    out = set()
    for path in found:
        root, *rest = re.split(r"\.", path)
        parts = [root] + [("*" + ("[]" if part.endswith("[]") else "")) if part.rstrip("[]") in keys else part
                          for part in rest]
        out.add(".".join(parts))
    return sorted(p for p in out if not any(o != p and (o.startswith(p + ".") or o.startswith(p + "["))
                                            for o in out))


# Carriers that an engine may fail to parse at all: named when the engine refuses the template's text
# (`{% set a, b = ... %}` is a syntax error to MiniJinja before 2.10), carriers otherwise.
PARSED_CARRIERS = frozenset({"stmt:set-multiple"})
_REFUSALS = (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY)
_PARSE_ERROR = re.compile(r"syntax|unexpected|expected", re.IGNORECASE)


def _parse_refusal(symptom: Symptom) -> bool:
    """Whether the engine refused the template's text itself (a syntax error), not a value at render time."""
    return symptom.status in _REFUSALS and bool(_PARSE_ERROR.search(symptom.refusal or ""))


def culprits(constructs: Iterable[str], refused: bool = False) -> list:
    """The constructs a cause is keyed and titled by: those that do more than carry data (and, for an engine's
    refusal, a carrier it may not parse)."""
    return sorted(n for n in set(constructs)
                  if n in OWN_OPS or (refused and n in PARSED_CARRIERS)
                  or (n not in CARRIERS and not n.startswith(CARRIER_FAMILIES)))


def _ws(text: str) -> bool:
    return not text.strip()


_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|&#?\w+;")
_TOKEN = re.compile(r"<\|?[\w.-]+\|?>")
_QUOTED = re.compile(r"'[^'\n]{1,60}'")
_JSON_BLOB = re.compile(r"[{\[][^\n]*[}\]]")


def _escapes(deleted: str, inserted: str) -> bool:
    """Whether one side is the other with characters written as escape sequences (`'` -> `\u0027`)."""
    for plain, escaped in ((deleted, inserted), (inserted, deleted)):
        if escaped and _ESCAPE.search(escaped) and plain and \
                _ESCAPE.sub("\x00", escaped).replace("\x00", "") == re.sub(r"[^\w\s]", "", plain):
            return True
    return False


def difference_class(reference: str, engine: str) -> str:
    """How two rendered texts differ, in one word."""
    if not engine and reference:
        return "nothing"
    pairs = raw_edits(reference, engine)
    if pairs and all(_ws(d) and _ws(i) for d, i in pairs):
        return "whitespace"
    if pairs and all(_escapes(d, i) for d, i in pairs):
        return "escapes"
    if sorted(reference) == sorted(engine):
        return "order"
    if reference.lower() == engine.lower():
        return "case"
    if reference.replace("'", '"') == engine.replace("'", '"'):
        return "quotes"
    if pairs and all(not i for _, i in pairs):
        return "omits"
    if pairs and all(not d for d, _ in pairs):
        return "adds"
    return "text"


def _whitespace_direction(pairs: list) -> str:
    if all(not d for d, _ in pairs):
        return "adds"
    if all(not i for _, i in pairs):
        return "drops"
    return "changes"


def reads_key(symptom: Symptom, constructs: Iterable[str], reference: Outcome, engine: Outcome,
              paths: Optional[list], ignores_template: bool = False) -> list:
    """The data paths (read_paths) a key and title name a reproducer by: those of a reproducer that differs in
    text (not whitespace) through no construct of its own, where the difference alone ("prints nothing") would
    put every such bug under one id (a token left unbound and a reasoning field not aliased both print
    nothing); [] otherwise."""
    if ignores_template or not paths or culprits(constructs) or symptom.status != Status.DIVERGED:
        return []
    # whitespace, or quotes (a printed mapping or list in the engine's own repr): how the engine prints,
    # whichever value it prints
    return [] if difference_class(reference.text, engine.text) in ("whitespace", "quotes") else list(paths)


def tested_reads(symptom: Symptom, constructs: Iterable[str], paths: Optional[list],
                 ignores_template: bool = False) -> list:
    """The data paths a reproducer whose culprit is a test (`is defined`, `is none`, `is string`) reads, when it
    differs in output: what is tested is the bug (`tools is defined` printing nothing when tools is null is not
    `enable_thinking is defined` printing extra text because the engine always binds it). [] otherwise, and []
    when the test alone answered differently on the value the reference gives it (isolate.py: `shown:test:...`):
    then the test is the bug, whatever it tests."""
    constructs = list(constructs)
    if ignores_template or not paths or symptom.status != Status.DIVERGED or \
            any(name.startswith("shown:test:") for name in constructs):
        return []
    return list(paths) if any(name.startswith("test:") for name in culprits(constructs)) else []


# Constructs that only ask whether a name is there, or give it a value when it is not.
_PRESENCE = frozenset({"test:defined", "test:undefined", "test:none", "test:true", "test:false", "test:boolean",
                       "filter:default", "filter:d"})


def unbound_globals(symptom: Symptom, reference: Outcome, engine: Outcome, paths: Optional[list],
                    case: Optional[dict], ignores_template: bool = False) -> list:
    """The bare names a differing reproducer reads that its case does not give (not a conversation field, not a
    kwarg): `enable_thinking`, `bos_token`, `date_string`. Their difference is how the engine binds that name,
    whatever the template does with it (`if enable_thinking` printing extra text and `if not enable_thinking`
    printing nothing are one engine binding `enable_thinking` as true). [] otherwise."""
    if ignores_template or not paths or case is None or symptom.status != Status.DIVERGED:
        return []
    if difference_class(reference.text, engine.text) == "whitespace":
        return []  # a newline or an indent is how the engine treats the template's text, not a binding
    given = set(case) | set((case.get("kwargs") or {}))
    return [path for path in paths if "." not in path and "[" not in path and path not in given]


def triggers(case: Optional[dict]) -> list:
    """What in a reproducer's data a key names as its trigger: a flag set (`continue_final_message`,
    `add_generation_prompt`), a role other than user/assistant/system, a null or a boolean (its keys written
    `*`, as read_paths writes them: R4's null keys are one trigger whichever key is null). A 1-minimal
    reproducer holds only the data its difference needs, so one construct printing one kind of difference
    through different triggers is different bugs (content printed as nothing for a continued final message,
    for typed content parts, for a developer message). Text and numbers are no trigger: which text a case
    holds is the case's."""
    found: set = set()

    def walk(value, top: str, depth: int, key: str) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                walk(item, top, depth + 1, str(name))
        elif isinstance(value, list):
            for item in value:
                walk(item, top, depth, key)
        elif value is None or isinstance(value, bool):
            found.add(f"{top}{'.*' * depth}={json.dumps(value)}")
        elif key == "role" and top == "messages" and value not in seen.USUAL_ROLES:
            found.add(f"role={value}")

    for top in ("messages", "tools", "documents", "kwargs"):
        if (case or {}).get(top):
            walk(case[top], top, 0, "")
    for flag in ("add_generation_prompt", "continue_final_message"):
        if (case or {}).get(flag):
            found.add(flag)
    return sorted(found)


# Request data no template is given (transformers and the engines act on it around the template): a difference
# it owns is the two sides' handling of it, whatever constructs the reproducer holds.
UNSEEN_BY_TEMPLATES = frozenset({"continue_final_message"})


# Tool-call arguments given as a JSON string (as OpenAI's API sends them), which a request layer may parse.
JSON_ARGUMENTS = "tool_calls.arguments=json"


def _parsed_arguments(case: dict) -> Optional[dict]:
    """The case with every tool call's JSON-string `arguments` parsed into its value; None when it has none."""
    out = json.loads(json.dumps(case))
    changed = False
    for message in out.get("messages") or []:
        for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    value = json.loads(function["arguments"])
                except ValueError:
                    continue
                if isinstance(value, (dict, list)):
                    function["arguments"] = value
                    changed = True
    return out if changed else None


# A message's reasoning given under one of its names: transformers hands the template every message with it
# under both `thinking` and `reasoning_content` (SEMANTICS.md R11); an engine that passes messages as given
# shows it under the name the request used only.
REASONING_NAMES = "messages.reasoning=one-name"
# A final assistant message continued where the request does not ask it (continue_final_message false): the
# output cut after that message's content (TGI's chat route does it whenever the last message is the assistant's).
# Nothing can be taken out (the cut follows from the conversation itself), so only its stand-in, the reference
# asked to continue, can show it.
CONTINUED_UNASKED = "continue_final_message=unasked"


# Rewrites a request layer may make of a conversation depending on the template (llama.cpp decides by probing
# what the template does with a system message, or with string content), which no probe template can show: the
# engine keeps the data as given for a probe that prints it. Each is tried on the reproducer's own template
# (causes._owned_by_request_rewrite). A rewrite has its variants of a case (the case as the request layer may
# rebuild it) and a control: another case that the same rewrite must explain too, which a template's own
# semantics would not (the system message as a user's, which no rewrite touches; every string content longer).

# A system message taken out: left out (llama.cpp, when it is alone) or folded into the next message's content
# (llama.cpp otherwise, with a newline). One trigger: a template that never prints the system text cannot tell
# the two apart.
SYSTEM_TAKEN_OUT = "system=taken-out"
FOLD_JOINS = ("\n\n", "\n", " ", "")
# A string content given to the template as a list of one text part: named as the probe names the same change
# (seen.changes), so an engine that does it for every template is one cause with one that does it for some.
CONTENT_AS_PARTS = seen.PREFIX + "messages[].content=string>list"
LENGTHENED = "xy"   # appended to every string content by CONTENT_AS_PARTS' control


def system_rewrites(case: Optional[dict]) -> list:
    """Each rewrite of a case's system messages a request layer may make: each system message left out, each
    folded into the next message's content (its text first, then one of FOLD_JOINS). Each message alone: a
    reproducer keeps the messages its difference needs."""
    messages = (case or {}).get("messages") or []
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "system":
            continue
        variant = json.loads(json.dumps(case))
        del variant["messages"][index]
        out.append(variant)
        following = messages[index + 1] if index + 1 < len(messages) else None
        if isinstance(message.get("content"), str) and isinstance(following, dict) and \
                isinstance(following.get("content"), str):
            for join in FOLD_JOINS:
                variant = json.loads(json.dumps(case))
                variant["messages"][index + 1]["content"] = message["content"] + join + following["content"]
                del variant["messages"][index]
                out.append(variant)
    return out


def system_as_user(case: dict) -> dict:
    """The case with every system message given as a user's: the control of system_rewrites."""
    return _with_messages(case, lambda message: dict(message, role="user") if message.get("role") == "system"
                          else message)


def content_as_parts(case: Optional[dict]) -> list:
    """The case with every string content as one text part, then each such message alone; [] without one."""
    messages = (case or {}).get("messages") or []
    where = [i for i, m in enumerate(messages) if isinstance(m, dict) and isinstance(m.get("content"), str)]
    if not where:
        return []
    parts = lambda message: dict(message, content=[{"type": "text", "text": message["content"]}])  # noqa: E731
    out = [_with_messages(case, lambda message: parts(message) if isinstance(message.get("content"), str)
                          else message)]
    if len(where) > 1:
        for index in where:
            variant = json.loads(json.dumps(case))
            variant["messages"][index] = parts(variant["messages"][index])
            out.append(variant)
    return out


def contents_lengthened(case: dict) -> dict:
    """The case with LENGTHENED after every string content: the control of content_as_parts (a template
    iterating or indexing the string answers otherwise for it; the rewrite's one part does not)."""
    return _with_messages(case, lambda message: dict(message, content=message["content"] + LENGTHENED)
                          if isinstance(message.get("content"), str) else message)


def _with_messages(case: dict, change) -> dict:
    out = json.loads(json.dumps(case))
    out["messages"] = [change(m) if isinstance(m, dict) else m for m in out.get("messages") or []]
    return out


# What a rewrite's template prints after the reproducer's own (causes._owned_by_request_rewrite), which the rewrite
# must explain too: a template-engine bug that only looks like a rewrite (a raise skipped, a string not iterable)
# leaves the messages as they were. Each looks only at what its rewrite changes, and never prints the content, so
# an engine that decides by what the template does with the content decides as it did: roles for a system
# message taken out (llama.cpp judges system support by whether the system content is used at all), the content's
# kind (string, mapping, list, other) for content given as parts.
ROLES_SUFFIX = "{% for m in messages %}|{{ m.role }}{% endfor %}"
KINDS_SUFFIX = ("{% for m in messages %}|{% if m.content is string %}s{% elif m.content is mapping %}m"
                "{% elif m.content is iterable %}l{% else %}o{% endif %}{% endfor %}")


class Rewrite(NamedTuple):
    variants: Callable    # case -> the case as the request layer may rebuild it, each way
    control: Callable     # case -> a case the rewrite must explain too (its variants pair with these by position)
    suffix: str           # printed after the template, for the rewrite to explain


REWRITES = {SYSTEM_TAKEN_OUT: Rewrite(system_rewrites, system_as_user, ROLES_SUFFIX),
            CONTENT_AS_PARTS: Rewrite(content_as_parts, contents_lengthened, KINDS_SUFFIX)}


def _aliased(case: dict) -> Optional[dict]:
    """The case with every message's reasoning under the names R11 gives it; None when that changes nothing.
    R11 is idempotent, so the reference renders the result exactly as it rendered the case."""
    out = json.loads(json.dumps(case))
    changed = False
    messages = out.get("messages") or []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        given = {k: v for k, v in message.items() if v is not None}
        aliased = alias_reasoning(given)
        if list(aliased.items()) != list(given.items()):
            # the nulls stay as given: R4's null keys are a trigger of their own
            messages[index] = {**aliased, **{k: None for k, v in message.items() if v is None}}
            changed = True
    return out if changed else None


# Request fields the reference always binds, as none when the request has none (SEMANTICS.md R7, R8); an engine's
# request layer may leave them unbound instead. Taken out by binding them in the template as the reference does.
NULL_FIELDS = ("tools", "documents")
UNBOUND = "=unbound"
CONTROL_NAME = "_chatgold_unread"   # bound by the control of a rebinding (causes.find_owners)


def unbound_fields(case: Optional[dict]) -> list:
    """The `NAME=unbound` triggers of a case: each of NULL_FIELDS the request has as none."""
    return [name + UNBOUND for name in NULL_FIELDS if case and name in case and case[name] is None]


def rebound(template: str, trigger: str) -> str:
    """The template with the field bound first as the reference binds it (none): an engine that left it
    unbound then sees what the reference sees, and the reference's answer cannot change. No whitespace control,
    and a print after the tag, so no engine's block-whitespace rule reaches the template's own first bytes."""
    return "{% set " + trigger[:-len(UNBOUND)] + " = none %}{{ '' }}" + template


# A global the engine binds where the request gives none (`enable_thinking`, `date_string`, `bos_token` as none):
# owned by that binding when the template reading another name, one nobody binds, leaves no difference.
BINDS = "binds:"
# A block-whitespace setting the engine's environment lacks (trim_blocks, lstrip_blocks): owned by it when the
# reference, given the template with that setting turned off tag by tag (template.whitespace_kept), prints what
# the engine printed, and the engine, given the same, answers as before.
ENVIRONMENT = "env:"
WHITESPACE_SETTINGS = ("trim_blocks", "lstrip_blocks")
RENAMED = "_chatgold_unbound"
_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
_STRING = r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'"


def bound_names(template: str, case: Optional[dict], bos_token: Optional[str], eos_token: Optional[str]) -> list:
    """The bare names a template reads that the request does not give (read_paths' roots, not a conversation
    field or kwarg; `bos_token`/`eos_token` only where the request has none): what an engine may bind on its
    own."""
    given = set(case or {}) | set((case or {}).get("kwargs") or {}) | REQUEST_NAMES
    given |= {name for name, token in (("bos_token", bos_token), ("eos_token", eos_token)) if token is not None}
    roots = {re.match(r"\w*", path).group(0) for path in read_paths(template, case)}
    return sorted(name for name in roots if name and name not in given | _JINJA_NAMES and name != CONTROL_NAME)


# Names Jinja itself binds inside a template or every engine has as a global: renaming one changes what the
# template does, not what the engine was given.
_JINJA_NAMES = frozenset({"loop", "caller", "varargs", "kwargs", "self", "super", "range", "namespace", "dict",
                          "lipsum", "cycler", "joiner", "raise_exception", "strftime_now", "true", "false", "none",
                          "True", "False", "None"})


def renamed(template: str, names: Iterable[str]) -> str:
    """The template with each of `names` read (and set) under another name no one binds: every bare use inside
    a tag, never an attribute (`x.name`), a keyword argument (`f(name=1)`) or text in quotes."""
    names = list(names)
    if not names:
        return template
    word = re.compile(rf"({_STRING})|(?<![\w.])({'|'.join(map(re.escape, names))})\b(\s*=(?!=))?")
    fresh = {name: f"{RENAMED}{index}" for index, name in enumerate(names)}

    def in_tag(tag) -> str:
        text = tag.group(0)
        setting = text.lstrip("{%-+ \t\n").startswith(("set ", "set\t"))

        def one(match) -> str:
            if match.group(1) or (match.group(3) and not setting):
                return match.group(0)
            return fresh[match.group(2)] + (match.group(3) or "")
        return word.sub(one, text)
    return _TAG.sub(in_tag, template)


def ownable(case: Optional[dict]) -> list:
    """The triggers of a reproducer's data (triggers) that can be taken out of it to see whether they own its
    difference: a flag set, an uncommon role, a null, tool-call arguments as a JSON string, a message's
    reasoning under one name, a field the request has as none (which an engine may leave unbound). A boolean is
    a value the template reads, not data an engine's request layer handles on its own."""
    found = [t for t in triggers(case) if not t.endswith(("=true", "=false"))]
    found += [JSON_ARGUMENTS] if case and _parsed_arguments(case) is not None else []
    found += [REASONING_NAMES] if case and _aliased(case) is not None else []
    found += [CONTINUED_UNASKED] if _ends_with_assistant(case) and not case.get("continue_final_message") else []
    return found + unbound_fields(case)


def _ends_with_assistant(case: Optional[dict]) -> bool:
    messages = (case or {}).get("messages")
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"


def ablate(case: dict, trigger: str) -> dict:
    """The case without one trigger: a flag unset, an uncommon role made `user`, every null under the named
    top-level field removed (a null key dropped, a null item left out), JSON-string tool arguments parsed, each
    message's reasoning given under every name R11 gives it."""
    if trigger == JSON_ARGUMENTS:
        return _parsed_arguments(case) or case
    if trigger == REASONING_NAMES:
        return _aliased(case) or case
    if trigger.endswith(UNBOUND) or trigger == CONTINUED_UNASKED:
        return case   # the template binds it (rebound) / nothing to take out (its stand-in shows it): the case stays
    out = json.loads(json.dumps(case))
    if trigger in ("add_generation_prompt", "continue_final_message"):
        out[trigger] = False
    elif trigger.startswith("role="):
        role = trigger[len("role="):]
        for message in out.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == role:
                message["role"] = "user"
    elif trigger.endswith("=null"):
        top = trigger.split(".", 1)[0].split("=", 1)[0]

        def drop(value):
            if isinstance(value, dict):
                return {k: drop(v) for k, v in value.items() if v is not None}
            if isinstance(value, list):
                return [drop(v) for v in value if v is not None]
            return value

        if out.get(top) is not None:
            out[top] = drop(out[top])
    return out


def stand_ins(case: dict, trigger: str) -> list:
    """The case with a trigger the template can see replaced by what an engine's request layer may make of it:
    an uncommon role as each usual one, a null as an empty string, JSON-string tool arguments parsed. The
    reference given one of them printing exactly what the engine printed shows the engine turned the trigger
    into it, whatever the template does."""
    if trigger == JSON_ARGUMENTS:
        return [_parsed_arguments(case) or case]
    if trigger == CONTINUED_UNASKED:
        # the reference refuses to continue and add a generation prompt at once; what the prompt would add
        # comes after the content, where the cut falls
        return [dict(json.loads(json.dumps(case)), continue_final_message=True, add_generation_prompt=False)]
    if trigger.startswith("role="):
        role = trigger[len("role="):]
        out = []
        for usual in ("system", "user", "assistant"):
            variant = json.loads(json.dumps(case))
            for message in variant.get("messages") or []:
                if isinstance(message, dict) and message.get("role") == role:
                    message["role"] = usual
            out.append(variant)
        return out
    if trigger.endswith("=null"):
        top = trigger.split(".", 1)[0].split("=", 1)[0]

        def empty(value):
            if isinstance(value, dict):
                return {k: "" if v is None else empty(v) for k, v in value.items()}
            if isinstance(value, list):
                return [empty(v) for v in value]
            return value

        variant = json.loads(json.dumps(case))
        if variant.get(top) is not None:
            variant[top] = empty(variant[top])
        return [variant]
    return []


def owner_subject(owner: Iterable[str]) -> str:
    """How a title names the data that owns a difference."""
    if tuple(owner) == (CONTINUED_UNASKED,):
        return "a final assistant message continued where the request does not ask it (`continue_final_message` " \
               "false)"
    said = []
    for trigger in owner:
        if trigger in ("add_generation_prompt", "continue_final_message"):
            said.append(f"`{trigger}`")
        elif trigger == JSON_ARGUMENTS:
            said.append("tool-call `arguments` given as a JSON string")
        elif trigger == REASONING_NAMES:
            said.append("a message's reasoning under one of its names")
        elif trigger.endswith(UNBOUND):
            name = trigger[:-len(UNBOUND)]
            said.append(f"`{name}` left unbound where the reference binds it")
        elif trigger.startswith("role="):
            said.append(f"a `{trigger[len('role='):]}` message")
        elif trigger == SYSTEM_TAKEN_OUT:
            said.append("a `system` message left out or folded into the next message")
        elif seen.is_seen(trigger):
            said.append(seen.subject(trigger))
        elif trigger.startswith(BINDS):
            said.append(f"`{trigger[len(BINDS):]}`")
        elif trigger.startswith(ENVIRONMENT):
            said.append(f"`{trigger[len(ENVIRONMENT):]}`")
        else:
            said.append(f"a null in `{trigger[:-len('=null')]}`")
    if all(trigger.startswith(BINDS) for trigger in owner):
        return ", ".join(said) + " (a global the conversation does not set)"
    if all(trigger.startswith(ENVIRONMENT) for trigger in owner):
        return " and ".join(said) + " off in the engine's environment (whatever the template's tags)"
    if all(seen.is_seen(trigger) for trigger in owner):
        return " with ".join(said)   # says itself that it is the request's data, rebuilt
    return " with ".join(said) + " (the request's data, whatever the template does with it)"


def text_identity(template: str) -> str:
    """A template's exact text as an identity (the first 12 hex digits of its sha256): what an engine that
    recognises templates by their text keys its own format by."""
    return hashlib.sha256(template.encode("utf-8", ENCODING_ERRORS)).hexdigest()[:12]


def cause_key(symptom: Symptom, constructs: Iterable[str], reference: Outcome, engine: Outcome,
              ignores_template: bool = False, paths: Optional[list] = None, case: Optional[dict] = None,
              owner: tuple = (), recognised: str = "") -> str:
    """The clustering key of a reduced reproducer. An engine that ignores the template (it renders the case
    the same with an empty one) is keyed by that and the kind of difference, not by the template's constructs.
    A reproducer with no construct of its own that differs in text is keyed by what it reads (`paths`, see
    reads_key) and the difference: the difference alone is never an identity. A difference in output is keyed
    by its data trigger too (triggers(case)); a refusal by its message. A difference that a trigger of its data
    owns (`owner`: taking that trigger out of the reproducer leaves no difference at all, both sides rendered) is
    the engine's handling of that data, keyed by it alone: a continued final message rebuilt by the engine
    shows through every template differently, and is one bug. An engine that picks a format of its own by the
    template's exact text (`recognised`: that text's identity) is keyed by the text too: each format it puts in
    place of a template it knows is its own code, and its own bugs."""
    if owner and not ignores_template:
        if all(trigger.startswith(BINDS) for trigger in owner):
            # the engine binds a global the request does not give: one bug whatever the template makes of it
            return f"{','.join(owner)}#diverges|binds"
        if all(trigger.startswith(ENVIRONMENT) for trigger in owner):
            # a setting of the engine's environment: one bug whichever tags of whichever template it reaches
            return f"{','.join(owner)}#diverges|environment"
        if all(seen.is_seen(trigger) for trigger in owner):
            # the request rebuilt before the template runs: one bug whatever each template makes of it
            return f"owned:{'+'.join(owner)}"
        # the data's handling is one bug whether the template then prints or refuses: a kept null refused by
        # `|length` and by `in` is the null printed as `None` elsewhere
        return f"owned:{'+'.join(owner)}#output"
    found = culprits(constructs, _parse_refusal(symptom))
    unbound = unbound_globals(symptom, reference, engine, paths, case, ignores_template)
    if unbound:
        # keyed by the names the engine binds, with the constructs that do more than ask for them
        names = ",".join([c for c in found if c not in _PRESENCE] + ["binds:" + name for name in unbound])
        return f"{names}#diverges|binds"
    reads = reads_key(symptom, constructs, reference, engine, paths, ignores_template)
    if reads:
        found = ["reads:" + path for path in reads]
    found = found + ["reads:" + path for path in tested_reads(symptom, constructs, paths, ignores_template)]
    if symptom.status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY) and \
            "raise_exception" not in symptom.refusal:
        # The engine refuses for a reason of its own; a `raise_exception()` the reproducer keeps only makes the
        # reference refuse too (raised-differently): the same refusal where the reference renders is one cause.
        found = [name for name in found if name != "global:raise_exception"]
    names = ("(ignores the template)" + (f"@{recognised}" if recognised else "")) if ignores_template else \
        ",".join(found)
    if symptom.status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        # A construct's refusal naming the template's own argument or name in quotes is one refusal whichever
        # it names: MiniJinja's `tojson` rejects `ensure_ascii=`, `separators=` and `sort_keys=` alike (it
        # takes only `indent`), checked by rendering each. With no construct, the quoted name is the identity.
        kind = "refuses|" + (_QUOTED.sub("'…'", symptom.refusal) if found else symptom.refusal)
    elif symptom.status == Status.ENGINE_RENDERED and ignores_template:
        # an engine that never runs the template never runs its checks either: which check the reference's
        # refusal comes from is the template's, and printing its own format there is the same behaviour as
        # printing it where the template renders (below)
        kind = "diverges"
    elif symptom.status == Status.ENGINE_RENDERED:
        # the reference's message may quote the case's data (`raise_exception('... ' + arguments)`): one
        # message of the template's whatever data it quotes
        kind = "renders|" + (_JSON_BLOB.sub("{…}", _QUOTED.sub("'…'", symptom.refusal)) if found else symptom.refusal)
    elif ignores_template:
        kind = "diverges"  # its own format against each template's: the edits say nothing more
    else:
        cls = difference_class(reference.text, engine.text)
        pairs = raw_edits(reference.text, engine.text)
        if cls == "whitespace":
            kind = "diverges|whitespace|" + _whitespace_direction(pairs)
            if not names:
                # which whitespace, once per run: a missing trim_blocks (newlines) is not a missing
                # lstrip_blocks (indentation); a construct's whitespace is the construct's, whichever it is
                kind += "|" + "|".join(sorted({f"{shape(d)}>{shape(i)}" for d, i in pairs}))
        elif names and not reads and cls in ("omits", "adds", "text", "nothing"):
            # A construct that misbehaves is one behaviour whatever text the template around it prints: its
            # reproducer's literals are the template's, not the engine's (loop.last printing one more `<`
            # and one fewer `\n` is one bug).
            kind = "diverges|text"
        else:
            kind = "diverges|" + cls
            # quotes: the engine's repr of a printed mapping or list, whichever strings it holds
            if cls in ("omits", "adds", "text", "case") or (cls == "quotes" and names):
                kind += "|" + "|".join(sorted({f"{shape(d)}>{shape(i)}" for d, i in pairs}))
    if case is not None and not ignores_template and symptom.status in (Status.DIVERGED, Status.ENGINE_RENDERED):
        data = triggers(case)
        if data:
            kind += "|data:" + ",".join(data)
    return f"{names}#{kind}"


def shape(text: str) -> str:
    """An edit's text as a key sees it: special tokens (`<s>`, `<|begin_of_text|>`) as one `<tok>`, escape
    sequences as one `\\u`, then normalised (signature.normalise_text: runs of words and numbers read as one
    `a`, quotes, brackets, markup and keywords kept), at most EDIT_LIMIT characters."""
    text = _ESCAPE.sub("\\\\u", _TOKEN.sub("<tok>", text))
    return normalise_text(text)[:EDIT_LIMIT]


def cause_id(key: str) -> str:
    return "c-" + hashlib.sha256(key.encode("utf-8", ENCODING_ERRORS)).hexdigest()[:10]


_SUBJECT = {
    "stmt": lambda n: "`{% " + n + " %}`",
    "filter": lambda n: f"`|{n}`",
    "test": lambda n: f"`is {n}`",
    "method": lambda n: f"`.{n}()`",
    "global": lambda n: f"`{n}()`",
    "loop": lambda n: f"`loop.{n}`",
    "text": lambda n: {"carriage-return": "a carriage return (`\\r`) in the template's text"}.get(n, n),
    "call": lambda n: {"macro": "a macro call", "caller": "`caller()`"}.get(n, "a call"),
    "ws": lambda n: {"trim-left": "`{%-`", "trim-right": "`-%}`", "keep-left": "`{%+`",
                     "keep-right": "`+%}`"}.get(n, n),
}
_OPS = {"concat": "`~`", "add": "`+`", "sub": "`-`", "mul": "`*`", "div": "`/`", "floordiv": "`//`", "mod": "`%`",
        "pow": "`**`", "and": "`and`", "or": "`or`", "not": "`not`", "neg": "unary `-`", "in": "`in`",
        "notin": "`not in`", "eq": "`==`", "ne": "`!=`", "lt": "`<`", "gt": "`>`", "lteq": "`<=`", "gteq": "`>=`",
        "slice": "slicing", "slice-step": "a slice with a step (`[::-1]`)", "subscript": "subscripts",
        "attr": "attribute access", "ternary": "`x if c else y`"}


def subject(names: list) -> str:
    parts = []
    for name in names[:3]:
        family, _, rest = name.partition(":")
        if family == "op":
            parts.append(_OPS.get(rest, rest))
        elif family in _SUBJECT:
            parts.append(_SUBJECT[family](rest))
        else:
            parts.append(f"`{name}`")
    text = ", ".join(parts) or "printed values"
    return text + (" ..." if len(names) > 3 else "")


_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote(text: str, limit: int = 24) -> str:
    """Text as a title quotes it: exactly, control characters written as escapes (a backslash the text prints
    stays one backslash), cut at a word or mark boundary past `limit` characters."""
    shown = "".join(_CONTROL.get(c, c if c.isprintable() else c.encode("unicode_escape").decode("ascii"))
                    for c in text).replace("`", "'")
    if len(shown) > limit:
        cut = limit
        while cut > limit // 2 and shown[cut - 1].isalnum() and shown[cut].isalnum():
            cut -= 1
        shown = shown[:cut] + "…"
    return f"`{shown}`" if shown else "nothing"


def title(symptom: Symptom, constructs: Iterable[str], reference: Outcome, engine: Outcome,
          ignores_template: bool = False, paths: Optional[list] = None, case: Optional[dict] = None,
          owner: tuple = (), recognised: str = "") -> str:
    """A short generated title: what the reduced reproducer uses (or, with no construct of its own, what it
    reads: reads_key; or the data that owns the difference: owner_subject), and how the engine differs on it.
    A template the engine recognises by its text is named by that text's identity (`recognised`)."""
    if owner and not ignores_template:
        return _how(owner_subject(owner), True, symptom, reference, engine, False)
    names = [] if ignores_template else culprits(constructs, _parse_refusal(symptom))
    reads = reads_key(symptom, constructs, reference, engine, paths, ignores_template)
    who = "the engine ignores the template" if ignores_template else subject(names)
    if ignores_template and recognised:
        # "ignores the template" kept: known mechanisms leave such causes to their own probe (known_mechanisms)
        who = f"the engine ignores the template it recognises by its text (sha256 {recognised}…)"
    if reads:
        who = ", ".join(f"`{path}`" for path in reads[:3]) + (" ..." if len(reads) > 3 else "")
    tested = tested_reads(symptom, constructs, paths, ignores_template)
    unbound = unbound_globals(symptom, reference, engine, paths, case, ignores_template)
    if unbound:
        rest = [name for name in names if name not in _PRESENCE]
        who = ", ".join(f"`{name}`" for name in unbound[:3]) + " (a global the conversation does not set)" + \
            (", " + subject(rest) if rest else "")
        tested = []
    if tested:
        who += " of " + ", ".join(f"`{path}`" for path in tested[:3]) + (" ..." if len(tested) > 3 else "")
    if ignores_template:
        names = ["(ignores the template)"]
    return _how(who, bool(names), symptom, reference, engine, ignores_template)


def _how(who: str, named: bool, symptom: Symptom, reference: Outcome, engine: Outcome,
         ignores_template: bool) -> str:
    """A title's `who: how the engine differs` (`named`: `who` names something the title can lead with)."""
    if symptom.status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        message = _shorten(first_line(engine.message), 80)
        return f"{who}: the engine refuses ({message})" if named else f"the engine refuses: {message}"
    if symptom.status == Status.ENGINE_RENDERED:
        message = _shorten(first_line(reference.message), 80)
        return (f"{who}: renders where the reference refuses ({message})" if named else
                f"renders where the reference refuses ({message})")
    ref, eng = reference.text, engine.text
    if ignores_template:
        return f"{who}: it renders its own format"
    cls = difference_class(ref, eng)
    pairs = raw_edits(ref, eng)
    first_d, first_i = pairs[0] if pairs else ("", "")
    if cls == "nothing":
        return f"{who}: prints nothing"
    if cls == "whitespace":
        if all(not d for d, _ in pairs):
            return f"{who}: prints extra whitespace ({_quote(first_i)})"
        if all(not i for _, i in pairs):
            return f"{who}: drops whitespace ({_quote(first_d)})"
        return f"{who}: prints {_quote(first_i)} where the reference prints {_quote(first_d)}"
    if cls == "order":
        return f"{who}: prints the same text in another order"
    if cls == "omits":
        return f"{who}: omits {_quote(first_d)}"
    if cls == "adds":
        return f"{who}: prints extra {_quote(first_i)}"
    if len(ref) <= 40 and len(eng) <= 40:
        return f"{who}: prints {_quote(eng, 40)} where the reference prints {_quote(ref, 40)}"
    left, right = _middles(ref, eng)
    return f"{who}: prints {_quote(right)} where the reference prints {_quote(left)}"


def _middles(a: str, b: str) -> tuple:
    """The differing middles of two texts (common prefix and suffix cut back to word boundaries)."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    while start > 0 and a[start - 1].isalnum():
        start -= 1
    while end > 0 and a[len(a) - end].isalnum():
        end -= 1
    return a[start:len(a) - end], b[start:len(b) - end]


def _shorten(text: str, limit: int) -> str:
    """A message cut to `limit` characters at a word boundary (never mid-word)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[:cut if cut > limit // 2 else limit - 1].rstrip() + " …"
