"""A template as a tree of its exact source text, and the smaller templates a reducer may try.

jinja2's own lexer finds the tags (so `"%}"` inside a string or `}}` inside a dict literal never ends one), but
the pieces kept are slices of the source: whitespace-control markers (`{%-`, `-%}`, `{%+`) and the text between
tags stay byte for byte, because many divergences are whitespace. Segments: text, comment, output (`{{ }}`),
statement (`{% %}`), raw (`{% raw %}...{% endraw %}` kept whole). Block statements (if/elif/else, for/else,
macro, call, filter, set-block, generation, with, block) nest their arms' bodies.

A candidate is a new tree; every candidate must still parse in jinja2 with the reference's tags
(`parses`), checked before anything is rendered. Expressions inside tags are simplified through jinja2's
expression parser and printed back (`expression_variants`): a filter dropped, one operand of an operator kept,
an argument dropped, a condition made constant.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator, Optional, Sequence, Union

import jinja2
import jinja2.ext
from jinja2 import nodes

# keyword -> (middle keywords, end keyword)
BLOCKS = {
    "if": (("elif", "else"), "endif"),
    "for": (("else",), "endfor"),
    "macro": ((), "endmacro"),
    "call": ((), "endcall"),
    "filter": ((), "endfilter"),
    "set": ((), "endset"),
    "generation": ((), "endgeneration"),
    "with": ((), "endwith"),
    "block": ((), "endblock"),
}
BEGIN_TOKENS = {"block_begin": "block_end", "variable_begin": "variable_end", "comment_begin": "comment_end",
                "raw_begin": "raw_end"}


@dataclass(frozen=True)
class Leaf:
    """One segment: kind is text, comment, output, stmt or raw; `keyword` names a statement."""

    kind: str
    text: str
    keyword: str = ""

    def source(self) -> str:
        return self.text


@dataclass(frozen=True)
class Arm:
    """One arm of a block: its opening tag (if/elif/else/for/...) and its body."""

    tag: Leaf
    body: tuple

    def source(self) -> str:
        return self.tag.text + "".join(n.source() for n in self.body)


@dataclass(frozen=True)
class Block:
    keyword: str
    arms: tuple
    end: Leaf

    def source(self) -> str:
        return "".join(a.source() for a in self.arms) + self.end.text


Node = Union[Leaf, Block]


def source_of(tree: Sequence[Node]) -> str:
    return "".join(n.source() for n in tree)


# -- parsing ----------------------------------------------------------------------------------------------

class _GenerationTag(jinja2.ext.Extension):
    """Parses `{% generation %}` as the reference (transformers' AssistantTracker) does; never renders."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_noop"), [], [], body).set_lineno(lineno)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    # The reference's parser: trim/lstrip do not change what parses; its tags (generation, loop controls) do.
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationTag, "jinja2.ext.loopcontrols"])


@lru_cache(maxsize=4096)
def parses(source: str) -> bool:
    """Whether jinja2 (with the reference's tags) parses this template. Parsing runs no template code."""
    return parsed(source) is not None


@lru_cache(maxsize=64)
def parsed(source: str) -> Optional[nodes.Template]:
    """The template's jinja2 tree (with the reference's tags), None when it does not parse; callers only read
    it. A reducer asks whether a candidate parses and then which names it reads, one right after the other: the
    few last trees kept make that one parse (a parse costs about what a render does)."""
    try:
        return _env().parse(source)
    except Exception:  # a syntax error, or the parser's recursion limit on a pathological input
        return None


def _tag_tokens(tokens: list) -> list:
    return [(kind, value) for _, kind, value in tokens if kind not in ("whitespace",)]


def segments(source: str) -> list[Leaf]:
    """The template as consecutive segments whose texts join to exactly `source`; one text leaf when jinja2
    cannot lex it (the reference then refuses it too: only the case can be reduced)."""
    try:
        tokens = list(jinja2.Environment().lex(source))
    except Exception:
        return [Leaf("text", source)] if source else []
    out: list[Leaf] = []
    pos, i = 0, 0
    while i < len(tokens):
        _, kind, value = tokens[i]
        if kind not in BEGIN_TOKENS:
            i += 1
            continue
        start = source.find(value.rstrip(), pos) if kind == "raw_begin" else source.find(value, pos)
        if start < 0:
            return [Leaf("text", source)]
        if start > pos:
            out.append(Leaf("text", source[pos:start]))
        end_kind = BEGIN_TOKENS[kind]
        j = i + 1
        while j < len(tokens) and tokens[j][1] != end_kind:
            j += 1
        if j >= len(tokens):
            return [Leaf("text", source)]
        end_marker = tokens[j][2].rstrip()
        if kind == "raw_begin":
            stop = source.find(end_marker, start + len(value.rstrip()))
            if stop < 0:
                return [Leaf("text", source)]
            stop += len(end_marker)
            out.append(Leaf("raw", source[start:stop]))
        else:
            inner = "".join(v for _, _, v in tokens[i + 1:j])
            begin = value.rstrip() if kind == "comment_begin" else value
            text = begin + inner + end_marker
            if not source.startswith(text, start):
                # comments keep their body verbatim, but be safe: find the end marker instead
                stop = source.find(end_marker, start + len(begin))
                if stop < 0:
                    return [Leaf("text", source)]
                text = source[start:stop + len(end_marker)]
            stop = start + len(text)
            if kind == "comment_begin":
                out.append(Leaf("comment", text))
            elif kind == "variable_begin":
                out.append(Leaf("output", text))
            else:
                names = [v for _, k, v in tokens[i + 1:j] if k == "name"]
                keyword = names[0] if names else ""
                if keyword == "set" and not any(k == "operator" and v == "=" for _, k, v in tokens[i + 1:j]):
                    keyword = "set-block"
                out.append(Leaf("stmt", text, keyword))
        pos = stop
        i = j + 1
    if pos < len(source):
        out.append(Leaf("text", source[pos:]))
    if "".join(s.text for s in out) != source:
        return [Leaf("text", source)]
    return out


# Jinja2 and MiniJinja both read `+` at a block or comment tag's end as "no trim_blocks here" and at its start
# as "no lstrip_blocks here".
_TAG_OPEN = re.compile(r"\A(\{[%#])(?![-+])")
_TAG_CLOSE = re.compile(r"(?<![-+])([%#]\})\Z")


def whitespace_kept(source: str, trim: bool = False, lstrip: bool = False) -> str:
    """`source` rendering, in an environment with trim_blocks and lstrip_blocks on, as it renders with
    trim_blocks off (`trim`) and/or lstrip_blocks off (`lstrip`): a `+` on every statement and comment tag that
    has no whitespace control of its own. Raw blocks are left as they are (their own trimming is theirs)."""
    out = []
    for leaf in segments(source):
        text = leaf.text
        if leaf.kind in ("stmt", "comment"):
            if lstrip:
                text = _TAG_OPEN.sub(r"\1+", text)
            if trim:
                text = _TAG_CLOSE.sub(r"+\1", text)
        out.append(text)
    return "".join(out)


def _block_keyword(leaf: Leaf) -> str:
    return "set" if leaf.keyword == "set-block" else leaf.keyword


def build_tree(source: str) -> tuple:
    """Nested nodes of the template; a flat list of leaves when its blocks do not balance."""
    segs = segments(source)
    try:
        tree, rest = _build(segs, 0, None)
    except ValueError:
        return tuple(segs)
    if rest != len(segs):
        return tuple(segs)
    return tree


def _build(segs: list, i: int, closing: Optional[tuple]) -> tuple:
    """(nodes, index of the segment that stopped them): stops at a middle/end keyword of `closing`."""
    out: list = []
    while i < len(segs):
        seg = segs[i]
        keyword = _block_keyword(seg) if seg.kind == "stmt" else ""
        if closing and keyword in closing:
            return tuple(out), i
        if seg.kind == "stmt" and (keyword in BLOCKS and (keyword != "set" or seg.keyword == "set-block")):
            middles, end = BLOCKS[keyword]
            arms, tag = [], seg
            i += 1
            while True:
                body, i = _build(segs, i, middles + (end,))
                arms.append(Arm(tag, body))
                if i >= len(segs):
                    raise ValueError(f"unclosed {keyword}")
                stop = segs[i]
                if stop.keyword == end:
                    out.append(Block(keyword, tuple(arms), stop))
                    i += 1
                    break
                tag = stop
                i += 1
            continue
        if seg.kind == "stmt" and (keyword.startswith("end") or keyword in ("elif", "else")):
            raise ValueError(f"stray {keyword}")
        out.append(seg)
        i += 1
    if closing:
        return tuple(out), i
    return tuple(out), i


# -- tree edits ---------------------------------------------------------------------------------------------
# A path addresses a node: (i,) is top-level node i; (i, a, j) is node j of arm a of block i; and so on.

def node_at(tree: tuple, path: tuple) -> Node:
    node = tree[path[0]]
    rest = path[1:]
    while rest:
        node = node.arms[rest[0]].body[rest[1]]
        rest = rest[2:]
    return node


def replace_at(tree: tuple, path: tuple, new: Sequence[Node]) -> tuple:
    """The tree with the node at `path` replaced by `new` (zero or more nodes)."""
    i = path[0]
    if len(path) == 1:
        return tree[:i] + tuple(new) + tree[i + 1:]
    block = tree[i]
    arm_index = path[1]
    arm = block.arms[arm_index]
    body = replace_at(arm.body, path[2:], new)
    arms = block.arms[:arm_index] + (replace(arm, body=body),) + block.arms[arm_index + 1:]
    return tree[:i] + (replace(block, arms=arms),) + tree[i + 1:]


def remove_paths(tree: tuple, paths: Sequence[tuple]) -> tuple:
    """The tree without the nodes at `paths` (deepest and last first, so earlier paths stay valid)."""
    for path in sorted(paths, key=lambda p: (len(p), p), reverse=True):
        tree = replace_at(tree, path, ())
    return tree


def paths_at_depth(tree: tuple, depth: int) -> list:
    """Paths of the nodes `depth` blocks deep (0: the top level)."""
    found: list = []

    def walk(nodes_: tuple, prefix: tuple, level: int) -> None:
        for index, node in enumerate(nodes_):
            path = prefix + (index,)
            if level == depth:
                found.append(path)
            elif isinstance(node, Block):
                for arm_index, arm in enumerate(node.arms):
                    walk(arm.body, path + (arm_index,), level + 1)

    walk(tree, (), 0)
    return found


def all_paths(tree: tuple) -> Iterator[tuple]:
    def walk(nodes_: tuple, prefix: tuple) -> Iterator[tuple]:
        for index, node in enumerate(nodes_):
            path = prefix + (index,)
            yield path
            if isinstance(node, Block):
                for arm_index, arm in enumerate(node.arms):
                    yield from walk(arm.body, path + (arm_index,))

    yield from walk(tree, ())


def count_nodes(tree: tuple) -> int:
    return sum(1 for _ in all_paths(tree))


def block_variants(block: Block) -> Iterator[tuple]:
    """Smaller forms of one block, as replacement node sequences: one arm's body alone (the tags dropped),
    the block without one of its later arms, the block without its first arm (the next `elif` becomes `if`)."""
    for arm in block.arms:
        yield arm.body
    flat = unrolled(block)
    if flat is not None:
        yield flat
    if block.keyword in ("if", "for") and len(block.arms) > 1:
        for index in range(1, len(block.arms)):
            yield (replace(block, arms=block.arms[:index] + block.arms[index + 1:]),)
        second = block.arms[1]
        if block.keyword == "if" and second.tag.keyword == "elif":
            tag = replace(second.tag, text=re.sub(r"\belif\b", "if", second.tag.text, count=1), keyword="if")
            yield (replace(block, arms=(replace(second, tag=tag),) + block.arms[2:]),)


_FOR = re.compile(r"^for\s+(.+?)\s+in\s+(.*?)(\s+recursive)?$", re.S)


def unrolled(block: Block) -> Optional[tuple]:
    """A `for` loop's first iteration without the loop: `{% set x = (items)[0] %}` then the body (no `loop`)."""
    if block.keyword != "for":
        return None
    parts = split_tag(block.arms[0].tag.text)
    if parts is None:
        return None
    opening, inner, closing = parts
    match = _FOR.match(inner)
    if not match or match.group(3):
        return None
    target, iterable = match.group(1), match.group(2)
    if _split_for_condition(iterable) is not None or "loop" in block.arms[0].source():
        return None
    tag = Leaf("stmt", f"{opening} set {target} = ({iterable})[0] {closing}", "set")
    return (tag,) + block.arms[0].body


def _macros(tree: tuple) -> dict:
    """name -> (parameter names, default sources, body nodes) of the template's simple macros."""
    found = {}
    for node in tree:
        if not (isinstance(node, Block) and node.keyword == "macro"):
            continue
        parts = split_tag(node.arms[0].tag.text)
        if parts is None:
            continue
        try:
            parsed = _env().parse("{% " + parts[1] + " %}{% endmacro %}").body[0]
        except Exception:
            continue
        body = node.arms[0].source()
        if not isinstance(parsed, nodes.Macro) or "caller" in body or "varargs" in body or "kwargs" in body:
            continue
        names = [a.name for a in parsed.args]
        try:
            defaults = [None] * (len(names) - len(parsed.defaults)) + [PRINTER.expr(d) for d in parsed.defaults]
        except Exception:  # a default this printer cannot write back: not inlined
            continue
        if re.search(r"\b" + re.escape(parsed.name) + r"\s*\(", "".join(n.source() for n in node.arms[0].body)):
            continue  # recursive: cannot be inlined
        found[parsed.name] = (names, defaults, node.arms[0].body)
    return found


def inline_variants(tree: tuple) -> Iterator[tuple]:
    """The tree with one call `{{ m(args) }}` of a simple macro replaced by the macro's body, its parameters
    set first (`{% set p = arg %}`, with the output tag's whitespace-control markers)."""
    macros = _macros(tree)
    if not macros:
        return
    for path in all_paths(tree):
        node = node_at(tree, path)
        if not (isinstance(node, Leaf) and node.kind == "output"):
            continue
        parts = split_tag(node.text)
        call = _parse_expr(parts[1]) if parts else None
        if not (isinstance(call, nodes.Call) and isinstance(call.node, nodes.Name) and call.node.name in macros):
            continue
        names, defaults, body = macros[call.node.name]
        if call.dyn_args is not None or call.dyn_kwargs is not None or len(call.args) > len(names):
            continue
        try:
            values = dict(zip(names, (PRINTER.expr(a) for a in call.args)))
            values.update({k.key: PRINTER.expr(k.value) for k in call.kwargs})
        except Exception:  # an argument this printer cannot write back
            continue
        if set(values) - set(names):
            continue
        opening = "{%" + parts[0][2:]
        sets = []
        for name, default in zip(names, defaults):
            value = values.get(name, default if default is not None else "none")
            sets.append(Leaf("stmt", f"{opening} set {name} = {value} %}}", "set"))
        yield replace_at(tree, path, tuple(sets) + tuple(body))


def text_variants(leaf: Leaf) -> Iterator[Leaf]:
    """Shorter text: whole lines dropped (halves first), then the text emptied of all but its line breaks."""
    lines = leaf.text.splitlines(keepends=True)
    if len(lines) > 1:
        half = len(lines) // 2
        yield replace(leaf, text="".join(lines[:half]))
        yield replace(leaf, text="".join(lines[half:]))
        for index in range(len(lines)):
            yield replace(leaf, text="".join(lines[:index] + lines[index + 1:]))
    stripped = leaf.text.strip()
    if len(stripped) > 1:
        head, tail = leaf.text[:len(leaf.text) - len(leaf.text.lstrip())], leaf.text[len(leaf.text.rstrip()):]
        yield replace(leaf, text=head + tail)
        words = stripped.split()
        if len(words) > 1:
            yield replace(leaf, text=head + words[0] + tail)


_MARKERS = re.compile(r"^\{[{%#][-+]?|[-+]?[}%#]\}$|\s+")


def match_key(leaf: Leaf) -> str:
    """A segment's identity across templates: tags without whitespace or whitespace-control markers."""
    if leaf.kind == "text":
        return "t" + leaf.text
    return leaf.kind[0] + _MARKERS.sub("", leaf.text)


def lines_of(source: str) -> int:
    """Template size as the issue counts it: lines that hold something other than whitespace."""
    return sum(1 for line in source.splitlines() if line.strip())


# -- expressions --------------------------------------------------------------------------------------------

_TAG = re.compile(r"^(\{[{%][-+]?)(\s*)(.*?)(\s*)([-+]?[}%]\})$", re.S)


def split_tag(text: str) -> Optional[tuple]:
    """(open marker, inner text, close marker) of an output or statement tag."""
    match = _TAG.match(text)
    if not match:
        return None
    return match.group(1), match.group(3), match.group(5)


class _Printer:
    """jinja2 expression nodes back to source. Operands that are not atoms are parenthesised, so the printed
    form parses to the same tree."""

    BINOPS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "Mod": "%", "Pow": "**",
              "And": "and", "Or": "or"}
    UNARY = {"Not": "not ", "Neg": "-", "Pos": "+"}
    COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">=", "in": "in",
               "notin": "not in"}

    def atom(self, node) -> str:
        text = self.expr(node)
        if isinstance(node, (nodes.Name, nodes.Const, nodes.Getattr, nodes.Getitem, nodes.Call, nodes.List,
                             nodes.Dict, nodes.Tuple)):
            return text
        return f"({text})"

    def expr(self, node) -> str:  # noqa: C901 - one case per node type
        kind = type(node).__name__
        if isinstance(node, nodes.Name):
            return node.name
        if isinstance(node, nodes.Const):
            return _literal(node.value)
        if isinstance(node, nodes.TemplateData):
            return _literal(node.data)
        if isinstance(node, nodes.List):
            return "[" + ", ".join(self.expr(i) for i in node.items) + "]"
        if isinstance(node, nodes.Tuple):
            items = [self.expr(i) for i in node.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(node, nodes.Dict):
            return "{" + ", ".join(f"{self.expr(p.key)}: {self.expr(p.value)}" for p in node.items) + "}"
        if isinstance(node, nodes.Getattr):
            return f"{self.atom(node.node)}.{node.attr}"
        if isinstance(node, nodes.Getitem):
            return f"{self.atom(node.node)}[{self.expr(node.arg)}]"
        if isinstance(node, nodes.Slice):
            parts = [self.expr(p) if p is not None else "" for p in (node.start, node.stop)]
            text = ":".join(parts)
            return text + (f":{self.expr(node.step)}" if node.step is not None else "")
        if kind in self.BINOPS:
            return f"{self.atom(node.left)} {self.BINOPS[kind]} {self.atom(node.right)}"
        if isinstance(node, nodes.Concat):
            return " ~ ".join(self.atom(n) for n in node.nodes)
        if kind in self.UNARY:
            return f"{self.UNARY[kind]}{self.atom(node.node)}"
        if isinstance(node, nodes.Compare):
            out = self.atom(node.expr)
            for op in node.ops:
                out += f" {self.COMPARE[op.op]} {self.atom(op.expr)}"
            return out
        if isinstance(node, nodes.CondExpr):
            text = f"{self.atom(node.expr1)} if {self.atom(node.test)}"
            return text + (f" else {self.atom(node.expr2)}" if node.expr2 is not None else "")
        if isinstance(node, nodes.Filter):
            return f"{self.atom(node.node)}|{node.name}{self._args(node)}"
        if isinstance(node, nodes.Test):
            return f"{self.atom(node.node)} is {node.name}{self._args(node)}"
        if isinstance(node, nodes.Call):
            return f"{self.atom(node.node)}{self._args(node, always=True)}"
        raise ValueError(f"cannot print {kind}")

    def _args(self, node, always: bool = False) -> str:
        parts = [self.expr(a) for a in node.args]
        parts += [f"{k.key}={self.expr(k.value)}" for k in node.kwargs]
        if node.dyn_args is not None:
            parts.append("*" + self.atom(node.dyn_args))
        if node.dyn_kwargs is not None:
            parts.append("**" + self.atom(node.dyn_kwargs))
        if not parts and not always:
            return ""
        return "(" + ", ".join(parts) + ")"


def _literal(value) -> str:
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (str, int, float)):
        return repr(value)  # jinja2 reads Python's string escapes and number forms
    raise ValueError(f"cannot print constant {value!r}")


PRINTER = _Printer()


def _smaller(node) -> Iterator:
    """Expressions one step simpler than `node` (each a jinja2 node)."""
    if isinstance(node, nodes.Filter):
        if node.node is not None:
            yield node.node
        if node.args or node.kwargs:
            yield nodes.Filter(node.node, node.name, [], [], None, None)
            for index in range(len(node.args)):
                yield nodes.Filter(node.node, node.name, node.args[:index] + node.args[index + 1:], node.kwargs,
                                   node.dyn_args, node.dyn_kwargs)
            for index in range(len(node.kwargs)):
                yield nodes.Filter(node.node, node.name, node.args, node.kwargs[:index] + node.kwargs[index + 1:],
                                   node.dyn_args, node.dyn_kwargs)
    elif isinstance(node, nodes.Test):
        yield nodes.Const(True)
        yield nodes.Const(False)
    elif isinstance(node, (nodes.And, nodes.Or)):
        yield node.left
        yield node.right
    elif isinstance(node, nodes.BinExpr):
        yield node.left
        yield node.right
    elif isinstance(node, nodes.Not):
        yield node.node
    elif isinstance(node, nodes.CondExpr):
        yield node.expr1
        if node.expr2 is not None:
            yield node.expr2
    elif isinstance(node, nodes.Concat):
        for index in range(len(node.nodes)):
            rest = node.nodes[:index] + node.nodes[index + 1:]
            yield rest[0] if len(rest) == 1 else nodes.Concat(rest)
    elif isinstance(node, nodes.Compare):
        yield nodes.Const(True)
        yield nodes.Const(False)
    elif isinstance(node, nodes.Call):
        for index in range(len(node.args)):
            yield nodes.Call(node.node, node.args[:index] + node.args[index + 1:], node.kwargs, node.dyn_args,
                             node.dyn_kwargs)
        for index in range(len(node.kwargs)):
            yield nodes.Call(node.node, node.args, node.kwargs[:index] + node.kwargs[index + 1:], node.dyn_args,
                             node.dyn_kwargs)
    elif isinstance(node, nodes.List) and node.items:
        for index in range(len(node.items)):
            yield nodes.List(node.items[:index] + node.items[index + 1:])
    elif isinstance(node, nodes.Tuple) and node.items:
        for index in range(len(node.items)):
            yield nodes.Tuple(node.items[:index] + node.items[index + 1:], "load")
    elif isinstance(node, nodes.Dict) and node.items:
        for index in range(len(node.items)):
            yield nodes.Dict(node.items[:index] + node.items[index + 1:])
    elif isinstance(node, (nodes.Getitem, nodes.Getattr)):
        # a shorter path: `tools[0].function` -> `tools[0]`, and a slice the difference does not need
        # (`messages[::-1]` from an unrolled reversed loop) that would otherwise be taken for a culprit
        yield node.node
    elif isinstance(node, nodes.Const) and isinstance(node.value, str) and len(node.value) > 1:
        yield nodes.Const("")
        yield nodes.Const(node.value[:1])
        yield nodes.Const(node.value[: len(node.value) // 2])
        yield nodes.Const(node.value[1:])
        yield nodes.Const(node.value[:-1])


def _children(node) -> list:
    """(attribute, index or None) of the sub-expressions a variant may replace."""
    slots = []
    for name in node.fields:
        value = getattr(node, name)
        if isinstance(value, nodes.Expr):
            slots.append((name, None))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, nodes.Expr):
                    slots.append((name, index))
                elif isinstance(item, (nodes.Keyword, nodes.Pair)):
                    slots.append((name, index))
    return slots


def _rebuilt(node, name: str, index: Optional[int], new):
    clone = object.__new__(type(node))
    for field_name in node.fields + node.attributes:
        setattr(clone, field_name, getattr(node, field_name, None))
    if index is None:
        setattr(clone, name, new)
    else:
        items = list(getattr(node, name))
        items[index] = new
        setattr(clone, name, items)
    return clone


def _variants(node, depth: int = 0) -> Iterator:
    """`node` with one sub-expression (or itself) made one step simpler; shallow changes first."""
    yield from _smaller(node)
    if depth > 6:
        return
    for name, index in _children(node):
        if (isinstance(node, nodes.Getitem) and name == "arg") or (isinstance(node, nodes.Call) and name == "node"):
            continue  # a key or a callee made simpler is a different program, not a smaller one
        child = getattr(node, name) if index is None else getattr(node, name)[index]
        if isinstance(child, nodes.Keyword):
            for sub in _variants(child.value, depth + 1):
                yield _rebuilt(node, name, index, nodes.Keyword(child.key, sub))
            continue
        if isinstance(child, nodes.Pair):
            for sub in _variants(child.value, depth + 1):
                yield _rebuilt(node, name, index, nodes.Pair(child.key, sub))
            continue
        for sub in _variants(child, depth + 1):
            yield _rebuilt(node, name, index, sub)


def _parse_expr(text: str):
    try:
        template = _env().parse("{{ " + text + " }}")
    except Exception:
        return None
    body = template.body
    if len(body) == 1 and isinstance(body[0], nodes.Output) and len(body[0].nodes) == 1:
        return body[0].nodes[0]
    return None


_STMT_EXPR = {
    # keyword -> regex splitting the statement body into (head, expression, tail)
    "if": re.compile(r"^(if\s+)(.*?)()$", re.S),
    "elif": re.compile(r"^(elif\s+)(.*?)()$", re.S),
    "set": re.compile(r"^(set\s+[^=]+?=\s*)(.*?)()$", re.S),
    "for": re.compile(r"^(for\s+.+?\s+in\s+)(.*?)(\s+recursive)?$", re.S),
}


def _tag_expression(leaf: Leaf) -> Optional[tuple]:
    """(opening, head, expression, tail, closing) of an output tag or a statement with one expression, so
    that f"{opening} {head}{expression}{tail} {closing}" is the tag again; None for any other tag."""
    parts = split_tag(leaf.text)
    if parts is None:
        return None
    opening, inner, closing = parts
    if leaf.kind == "output":
        return opening, "", inner, "", closing
    if leaf.kind == "stmt" and leaf.keyword in _STMT_EXPR:
        match = _STMT_EXPR[leaf.keyword].match(inner)
        if match:
            return opening, match.group(1), match.group(2), match.group(3) or "", closing
    return None


def expression_variants(leaf: Leaf, limit: int = 40) -> Iterator[Leaf]:
    """The tag with its expression simplified one step (at most `limit` variants, simplest changes first)."""
    parts = _tag_expression(leaf)
    if parts is None:
        return
    opening, head, expr_text, tail, closing = parts
    if leaf.kind == "stmt" and leaf.keyword == "for":
        # `for x in items if cond`: the filter condition is a variant of its own
        condition = _split_for_condition(expr_text)
        if condition is not None:
            yield replace(leaf, text=f"{opening} {head}{condition[0]}{tail} {closing}")
            expr_text = condition[0]
            tail = f" if {condition[1]}{tail}"
    node = _parse_expr(expr_text)
    if node is None:
        return
    seen = set()
    count = 0
    variants = iter(_variants(node))
    if leaf.kind == "stmt" and leaf.keyword in ("if", "elif"):
        variants = itertools.chain([nodes.Const(True)], variants)
    while True:
        try:
            variant = next(variants)
            printed = PRINTER.expr(variant)
        except StopIteration:
            return
        except Exception:  # a node this printer or jinja2's constructors do not take: no variant
            continue
        if printed in seen or printed == expr_text:
            continue
        seen.add(printed)
        yield replace(leaf, text=f"{opening} {head}{printed}{tail} {closing}")
        count += 1
        if count >= limit:
            return


def _split_for_condition(text: str) -> Optional[tuple]:
    """(iterable, condition) when a for loop's iterable carries a filter condition (`in xs if c`)."""
    for match in re.finditer(r"\s+if\s+", text):
        head, cond = text[:match.start()], text[match.end():]
        if _parse_expr(head) is not None and _parse_expr(cond) is not None:
            return head, cond
    return None


# -- coverage ----------------------------------------------------------------------------------------------

MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"
_MARK = re.compile(MARK_OPEN + r"(\d+)" + MARK_CLOSE)


def _rewritten(tree: tuple, on_arm, on_leaf) -> str:
    """The tree's source with text inserted at the start of each arm body (on_arm(arm path)) and each leaf
    replaced by on_leaf(leaf, path)."""

    def walk(nodes_: tuple, prefix: tuple) -> str:
        out = []
        for index, node in enumerate(nodes_):
            path = prefix + (index,)
            if isinstance(node, Block):
                for arm_index, arm in enumerate(node.arms):
                    arm_path = path + (arm_index,)
                    out.append(arm.tag.text + on_arm(arm_path) + walk(arm.body, arm_path))
                out.append(node.end.text)
            else:
                out.append(on_leaf(node, path))
        return "".join(out)

    return walk(tree, ())


def instrumented(tree: tuple) -> tuple[str, dict]:
    """The template with a marker printed at the start of every arm body, and marker number -> arm path
    (block path + (arm index,)). Rendering it tells which arms ran; the markers change no control flow."""
    arms: dict = {}

    def mark(arm_path: tuple) -> str:
        number = len(arms)
        arms[number] = arm_path
        return "{{ '" + MARK_OPEN + str(number) + MARK_CLOSE + "' }}"

    return _rewritten(tree, mark, lambda leaf, path: leaf.text), arms


def executed_arms(output: str, arms: dict) -> set:
    return {arms[int(m.group(1))] for m in _MARK.finditer(output) if int(m.group(1)) in arms}


def prune_unexecuted(tree: tuple, ran: set) -> tuple:
    """The tree without the arms that never ran (a block none of whose arms ran goes entirely)."""

    def walk(nodes_: tuple, prefix: tuple) -> tuple:
        out = []
        for index, node in enumerate(nodes_):
            path = prefix + (index,)
            if not isinstance(node, Block):
                out.append(node)
                continue
            if node.keyword == "call":
                # a call block's body runs only if the macro calls caller(); the call itself still happened
                out.append(node)
                continue
            kept = [replace(arm, body=walk(arm.body, path + (arm_index,)))
                    for arm_index, arm in enumerate(node.arms) if path + (arm_index,) in ran]
            if not kept:
                continue
            if node.keyword == "if" and kept[0].tag.keyword in ("elif", "else"):
                # the first arm that ran is not the `if`: keep the `if` arm with an empty body before it
                first = node.arms[0]
                kept.insert(0, replace(first, body=()))
            if node.keyword == "for" and kept[0].tag.keyword == "else":
                kept.insert(0, replace(node.arms[0], body=()))
            out.append(replace(node, arms=tuple(kept)))
        return tuple(out)

    return walk(tree, ())


OUT_OPEN, OUT_CLOSE = "\ue002", "\ue003"
_OUT_MARK = re.compile(OUT_OPEN + r"([se])(\d+)" + OUT_CLOSE)


def instrumented_outputs(tree: tuple) -> tuple[str, dict]:
    """The template with every output tag wrapped in start and end markers, and marker number -> leaf path.
    The start marker takes the tag's left whitespace control and the end marker its right one, so the text
    around keeps its whitespace; rendering it tells what each output printed."""
    leaves: dict = {}

    def mark(kind: str, number: int) -> str:
        return "'" + OUT_OPEN + kind + str(number) + OUT_CLOSE + "'"

    def wrap(leaf: Leaf, path: tuple) -> str:
        parts = split_tag(leaf.text) if leaf.kind == "output" else None
        if parts is None:
            return leaf.text
        number = len(leaves)
        leaves[number] = path
        opening, inner, closing = parts
        return f"{opening} {mark('s', number)} }}}}{{{{ {inner} }}}}{{{{ {mark('e', number)} {closing}"

    return _rewritten(tree, lambda arm_path: "", wrap), leaves


def printed_by_outputs(text: str) -> dict:
    """marker number -> what that output printed, each time it ran (inner outputs' markers removed)."""
    printed: dict = {}
    stack: list = []
    position = 0
    pieces: list = [[]]
    for match in _OUT_MARK.finditer(text):
        pieces[-1].append(text[position:match.start()])
        position = match.end()
        kind, number = match.group(1), int(match.group(2))
        if kind == "s":
            stack.append(number)
            pieces.append([])
        elif stack and stack[-1] == number:
            stack.pop()
            inner = "".join(pieces.pop())
            printed.setdefault(number, []).append(inner)
            pieces[-1].append(inner)
        else:
            return {}  # unbalanced (an output cut short): no answer rather than a wrong one
    return printed if not stack else {}


# -- a render-neutral edit ----------------------------------------------------------------------------------

NEUTRAL_PREFIX = "{{ '' }}"


def neutral_variant(source: str) -> str:
    """The same template in other bytes, rendering the same under every whitespace mode: one space added just
    inside the first `{{ }}` or `{% %}` tag (after its whitespace-control marker), or, in a template without
    one, an output of the empty string first. A comment is not neutral: with trim_blocks on a comment eats the
    newline after it, and with it off, a newline after an appended comment is printed where a template's
    final newline was stripped."""
    offset = 0
    for leaf in segments(source):
        if leaf.kind in ("output", "stmt"):
            parts = split_tag(leaf.text)
            if parts is not None:
                head = parts[0]
                at = offset + len(head)
                return source[:at] + " " + source[at:]
        offset += len(leaf.text)
    return NEUTRAL_PREFIX + source


def neutral_variants(source: str) -> list:
    """Two equivalent templates in other bytes, one edit at the first tag and one ahead of it: an engine keying
    templates by their whole text (a record found by hash) answers both otherwise, where a layer that rewrites
    one tag's exact text (TGI deleting `{% generation %}`) misses only the first and still runs the template."""
    return list(dict.fromkeys([neutral_variant(source), NEUTRAL_PREFIX + source]))


def literal_variants(leaf: Leaf) -> Iterator[tuple]:
    """(tag, old, new): the tag with one string literal of its expression shortened (emptied, its first
    character, its first half, without its first or last character), with the literal's value before and after:
    a reducer expects the printed difference to change the same way (a literal the difference prints is
    renamed in it)."""
    parts = _tag_expression(leaf)
    if parts is None:
        return
    opening, head, expr_text, tail, closing = parts
    node = _parse_expr(expr_text)
    if node is None:
        return
    consts = [node] if isinstance(node, nodes.Const) else list(node.find_all(nodes.Const))
    for const in consts:
        value = const.value
        if not isinstance(value, str) or not value:
            continue
        for cut in dict.fromkeys(["", value[:1], value[:len(value) // 2], value[1:], value[:-1]]):
            if cut == value:
                continue
            const.value = cut
            try:
                printed = PRINTER.expr(node)
            except Exception:  # a node the printer does not take: no variant
                continue
            finally:
                const.value = value
            yield replace(leaf, text=f"{opening} {head}{printed}{tail} {closing}"), value, cut
