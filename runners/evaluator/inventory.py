"""Construct inventory: which Jinja constructs a template uses, by stable name, with their source lines.

Naming scheme (`<family>:<name>`; every fixed name is described in constructs.json):
  stmt:*     statements — for, for-recursive, for-else, for-filtered, if, elif, else, macro, macro-recursive,
             call (call block), set, set-block, set-namespace (ns.attr = ...), set-multiple (a, b = ...),
             filter (filter block), generation, break, continue, with, raw, block, extends, include, import
  loop:*     attributes of the `loop` variable read by the template (loop:index0, loop:last, ...), loop:call
             for `loop(children)` in a recursive for
  filter:<n> every filter by name;   test:<n> every test by name (`is defined`, `is not none` -> test:none)
  method:<n> a Python method called on a value (x.strip(), d.items(), s.split(...))
  global:<n> a call to a global function (raise_exception, strftime_now, range, namespace, dict, ...)
  call:*     call:macro (a macro defined in the template), call:caller, call:other
  op:*       operators — concat (~), add, sub, mul, div, floordiv, mod, pow, and, or, not, neg, pos, in,
             notin, eq, ne, lt, gt, lteq, gteq, slice, subscript, attr, ternary (x if c else y)
  ws:*       whitespace control — ws:trim-left ({%- {{- {#-), ws:trim-right (-%} -}} -#}),
             ws:keep-left ({%+ {{+), ws:keep-right (+%})
  syntax:*   syntax:comment
  literal:*  literal:list, literal:dict, literal:tuple, literal:none, literal:bool, literal:int,
             literal:float, literal:str-escape (a string literal written with a backslash escape)
  var:<n>    a variable the template reads from its context (messages, tools, bos_token, enable_thinking, ...)
Statements and globals are named by their own syntax, so the names are stable across jinja2 versions.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Tuple

import jinja2.meta
from jinja2 import nodes

from .codegen import KNOWN_GLOBALS

_OPS = {
    nodes.Concat: "op:concat", nodes.Add: "op:add", nodes.Sub: "op:sub", nodes.Mul: "op:mul",
    nodes.Div: "op:div", nodes.FloorDiv: "op:floordiv", nodes.Mod: "op:mod", nodes.Pow: "op:pow",
    nodes.And: "op:and", nodes.Or: "op:or", nodes.Not: "op:not", nodes.Neg: "op:neg", nodes.Pos: "op:pos",
    nodes.CondExpr: "op:ternary",
}
_COMPARE = {"eq": "op:eq", "ne": "op:ne", "lt": "op:lt", "gt": "op:gt", "lteq": "op:lteq", "gteq": "op:gteq",
            "in": "op:in", "notin": "op:notin"}
_STATEMENTS = {
    nodes.If: "stmt:if", nodes.Macro: "stmt:macro", nodes.AssignBlock: "stmt:set-block",
    nodes.FilterBlock: "stmt:filter", nodes.With: "stmt:with", nodes.Block: "stmt:block",
    nodes.Extends: "stmt:extends", nodes.Include: "stmt:include", nodes.Import: "stmt:import",
    nodes.FromImport: "stmt:import", nodes.ExprStmt: "stmt:do",
}
_WS_TOKENS = {"block_begin", "variable_begin", "comment_begin", "block_end", "variable_end", "comment_end"}

CATALOGUE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "constructs.json")


@dataclass
class Inventory:
    """name -> sorted source lines where it occurs."""

    constructs: Dict[str, Tuple[int, ...]] = field(default_factory=dict)

    def names(self) -> List[str]:
        return sorted(self.constructs)

    def lines(self, name: str) -> Tuple[int, ...]:
        return self.constructs.get(name, ())

    def at_line(self, lineno: int) -> List[str]:
        return sorted(name for name, lines in self.constructs.items() if lineno in lines)

    def __contains__(self, name: str) -> bool:
        return name in self.constructs

    def to_dict(self) -> dict:
        return {name: list(lines) for name, lines in sorted(self.constructs.items())}


class _Collector:
    def __init__(self):
        self.found: Dict[str, set] = {}

    def add(self, name: str, lineno) -> None:
        self.found.setdefault(name, set()).add(lineno or 0)


@lru_cache(maxsize=128)
def _inventory_cached(template_src: str) -> Inventory:
    from .environment import environment

    env = environment()
    tree = env.parse_plain(template_src)
    found = _Collector()
    macros = {node.name: node for node in tree.find_all(nodes.Macro)}
    _walk_nodes(tree, found, macros)
    _walk_tokens(env, template_src, found)
    undeclared = jinja2.meta.find_undeclared_variables(tree)
    for node in tree.find_all(nodes.Name):
        if node.ctx == "load" and node.name in undeclared:
            found.add(f"var:{node.name}", node.lineno)
    return Inventory({name: tuple(sorted(lines)) for name, lines in found.found.items()})


def inventory(template_src: str) -> Inventory:
    """The constructs `template_src` uses. Raises TemplateCompileError when it does not parse."""
    from jinja2.exceptions import TemplateSyntaxError

    from .errors import TemplateCompileError

    try:
        return _inventory_cached(template_src)
    except TemplateSyntaxError as exc:
        raise TemplateCompileError(str(exc), exc.lineno, reference_type=type(exc).__name__,
                                   reference_message=str(exc)) from None


def _walk_nodes(tree: nodes.Template, found: _Collector, macros) -> None:
    for node in tree.find_all(nodes.Node):
        line = node.lineno
        kind = type(node)
        if kind in _STATEMENTS:
            found.add(_STATEMENTS[kind], line)
        if isinstance(node, nodes.If):
            if node.elif_:
                for elif_node in node.elif_:
                    found.add("stmt:elif", elif_node.lineno)
            if node.else_:
                found.add("stmt:else", line)
        elif isinstance(node, nodes.For):
            found.add("stmt:for", line)
            if node.recursive:
                found.add("stmt:for-recursive", line)
            if node.else_:
                found.add("stmt:for-else", line)
            if node.test is not None:
                found.add("stmt:for-filtered", line)
        elif isinstance(node, nodes.Macro):
            if any(isinstance(call.node, nodes.Name) and call.node.name == node.name
                   for call in node.find_all(nodes.Call)):
                found.add("stmt:macro-recursive", line)
        elif isinstance(node, nodes.CallBlock):
            if isinstance(node.call.node, nodes.ExtensionAttribute):
                found.add("stmt:generation", line)
            else:
                found.add("stmt:call", line)
        elif isinstance(node, nodes.Assign):
            if isinstance(node.target, nodes.NSRef) or any(True for _ in node.target.find_all(nodes.NSRef)):
                found.add("stmt:set-namespace", line)
            elif isinstance(node.target, nodes.Tuple):
                found.add("stmt:set-multiple", line)
            else:
                found.add("stmt:set", line)
        elif isinstance(node, nodes.Break):
            found.add("stmt:break", line)
        elif isinstance(node, nodes.Continue):
            found.add("stmt:continue", line)
        elif isinstance(node, nodes.Filter):
            found.add(f"filter:{node.name}", line)
        elif isinstance(node, nodes.Test):
            found.add(f"test:{node.name}", line)
        elif isinstance(node, nodes.Call):
            target = node.node
            if isinstance(target, nodes.Getattr):
                found.add(f"method:{target.attr}", line)
            elif isinstance(target, nodes.Name):
                if target.name == "loop":
                    found.add("loop:call", line)
                elif target.name == "caller":
                    found.add("call:caller", line)
                elif target.name in macros:
                    found.add("call:macro", line)
                elif target.name in KNOWN_GLOBALS:
                    found.add(f"global:{target.name}", line)
                else:
                    found.add("call:other", line)
            else:
                found.add("call:other", line)
        elif isinstance(node, nodes.Getattr):
            if isinstance(node.node, nodes.Name) and node.node.name == "loop":
                found.add(f"loop:{node.attr}", line)
            else:
                found.add("op:attr", line)
        elif isinstance(node, nodes.Getitem):
            found.add("op:slice" if isinstance(node.arg, nodes.Slice) else "op:subscript", line)
        elif isinstance(node, nodes.Compare):
            for operand in node.ops:
                found.add(_COMPARE.get(operand.op, f"op:{operand.op}"), line)
        elif kind in _OPS:
            found.add(_OPS[kind], line)
        elif isinstance(node, nodes.List):
            found.add("literal:list", line)
        elif isinstance(node, nodes.Dict):
            found.add("literal:dict", line)
        elif isinstance(node, nodes.Tuple) and node.ctx == "load":
            found.add("literal:tuple", line)
        elif isinstance(node, nodes.Const):
            value = node.value
            if value is None:
                found.add("literal:none", line)
            elif isinstance(value, bool):
                found.add("literal:bool", line)
            elif isinstance(value, int):
                found.add("literal:int", line)
            elif isinstance(value, float):
                found.add("literal:float", line)


def _walk_tokens(env, source: str, found: _Collector) -> None:
    from jinja2.lexer import TOKEN_STRING

    for lineno, token, value in env.lex(source):
        if token in _WS_TOKENS:
            marker = value.strip()
            if token.endswith("_begin"):
                if marker.endswith("-"):
                    found.add("ws:trim-left", lineno)
                elif marker.endswith("+"):
                    found.add("ws:keep-left", lineno)
                if token == "comment_begin":
                    found.add("syntax:comment", lineno)
            elif marker.startswith("-"):
                found.add("ws:trim-right", lineno)
            elif marker.startswith("+"):
                found.add("ws:keep-right", lineno)
        elif token == "raw_begin":
            found.add("stmt:raw", lineno)
        elif token == TOKEN_STRING and "\\" in value:
            found.add("literal:str-escape", lineno)


@lru_cache(maxsize=1)
def catalogue() -> dict:
    """constructs.json: {name: {"family", "summary", "example"}}; family entries end in ':*'."""
    with open(CATALOGUE_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def describe(name: str) -> dict:
    """The catalogue entry for `name`, falling back to its family entry (e.g. method:* for method:casefold)."""
    entries = catalogue()["constructs"]
    if name in entries:
        return entries[name]
    family = name.split(":", 1)[0] + ":*"
    if family in entries:
        return entries[family]
    raise KeyError(f"construct {name!r} is not in {CATALOGUE_PATH}")
