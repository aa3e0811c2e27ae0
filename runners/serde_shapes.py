"""Which request bodies a Rust product refuses when serde deserialises them, and serde's own words for it.

TGI and mistral.rs read an OpenAI-style request into typed structs before any template runs; a body those
structs cannot hold is refused there (TGI: HTTP 422, mistral.rs's Python API: ValueError). The runners that
reproduce those products (runners/tgi_runner.py, runners/mistralrs_runner.py) must refuse the same bodies with
the same text, or a reducer shrinks a request (a tool down to `{}`) into one the product would never render.

A shape is described here with the serde attributes that matter (required or `Option`, aliases, untagged and
flattened enums) and checked the way serde_json walks a document: object keys in document order, a known
field's value checked where it stands, unknown keys ignored, then missing fields in declaration order at the
object's closing brace. Positions are serde_json's "at line 1 column C", C the 1-based byte column in the one
serialisation the runner fixes (the client's bytes decide it; see each runner): the end of a scalar of the
wrong type, the start of a container of the wrong type, the closing brace for a missing field or an untagged
enum no variant of which matches, the end of the second key for a duplicate field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional


class SerdeError(Exception):
    def __init__(self, path: str, message: str, column: int):
        super().__init__(message)
        self.path, self.message, self.column = path, message, column

    def text(self, with_path: bool) -> str:
        where = f" at line 1 column {self.column}"
        return f"{self.path}: {self.message}{where}" if with_path else f"{self.message}{where}"


class _NoMatch(Exception):
    """Inside an untagged enum's attempt: this variant does not hold the data (serde drops why)."""


# -- where each value stands in the serialised document -------------------------------------------------------
@dataclass
class Layout:
    """Byte spans of every value (and of every object key) of one serialisation."""

    text: str
    spans: dict = field(default_factory=dict)       # path tuple -> (first byte, last byte), 0-based
    key_ends: dict = field(default_factory=dict)    # path tuple of a value -> last byte of its key


def layout(value, separators=(",", ":"), ensure_ascii=False) -> Layout:
    item_sep, key_sep = separators
    parts: list = []
    size = [0]
    out = Layout("")

    def emit(text: str) -> None:
        parts.append(text)
        size[0] += len(text.encode("utf-8"))

    def walk(node, path: tuple) -> None:
        start = size[0]
        if isinstance(node, dict):
            emit("{")
            for index, (key, child) in enumerate(node.items()):
                if index:
                    emit(item_sep)
                emit(json.dumps(str(key), ensure_ascii=ensure_ascii))
                out.key_ends[path + (key,)] = size[0] - 1
                emit(key_sep)
                walk(child, path + (key,))
            emit("}")
        elif isinstance(node, list):
            emit("[")
            for index, child in enumerate(node):
                if index:
                    emit(item_sep)
                walk(child, path + (index,))
            emit("]")
        else:
            emit(json.dumps(node, ensure_ascii=ensure_ascii))
        out.spans[path] = (start, size[0] - 1)

    walk(value, ())
    out.text = "".join(parts)
    return out


def _unexpected(value) -> str:
    """serde's `Unexpected` as it prints a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {json.dumps(value, ensure_ascii=False)}"
    return "sequence" if isinstance(value, list) else "map"


# -- shapes --------------------------------------------------------------------------------------------------
class Shape:
    def check(self, value, path: tuple, doc: Layout) -> None:
        raise NotImplementedError

    @staticmethod
    def wrong_type(value, path: tuple, doc: Layout, expected: str) -> SerdeError:
        first, last = doc.spans[path]
        column = (first if isinstance(value, (dict, list)) else last) + 1
        return SerdeError(path_text(path), f"invalid type: {_unexpected(value)}, expected {expected}", column)


@dataclass
class Leaf(Shape):
    """A value of one JSON type (`Option<...>` of it when nullable); `expected` is serde's word for it."""

    types: tuple
    expected: str
    nullable: bool = False

    def accepts(self, value) -> bool:
        return isinstance(value, self.types) or (value is None and self.nullable)

    def check(self, value, path, doc):
        if not self.accepts(value):
            raise self.wrong_type(value, path, doc, self.expected)


def Any_() -> Leaf:
    """serde_json::Value: anything."""
    return Leaf((object,), "any value")


def Str(nullable: bool = False) -> Leaf:
    return Leaf((str,), "a string", nullable)


def Bool(nullable: bool = False) -> Leaf:
    return Leaf((bool,), "a boolean", nullable)


def MapOf(nullable: bool = False) -> Leaf:
    """HashMap<String, serde_json::Value>."""
    return Leaf((dict,), "a map", nullable)


@dataclass
class Seq(Shape):
    item: Shape
    nullable: bool = False

    def check(self, value, path, doc):
        if value is None and self.nullable:
            return
        if not isinstance(value, list):
            raise self.wrong_type(value, path, doc, "a sequence")
        for index, child in enumerate(value):
            self.item.check(child, path + (index,), doc)


@dataclass
class UnitEnum(Shape):
    """A field-less enum read from its string (`"function"`)."""

    variants: tuple

    def check(self, value, path, doc):
        first, last = doc.spans[path]
        if not isinstance(value, str):
            # serde_json peeks for a string or a map and finds neither
            raise SerdeError(path_text(path), "expected value", first + 1)
        if value not in self.variants:
            expected = " or ".join(f"`{v}`" for v in self.variants)
            raise SerdeError(path_text(path), f"unknown variant `{value}`, expected {expected}", last + 1)


@dataclass
class Field:
    name: str
    shape: Shape
    required: bool = True       # a missing `Option<T>` or `#[serde(default)]` field is not an error
    aliases: tuple = ()


@dataclass
class Struct(Shape):
    name: str
    fields: list
    flatten: Optional[Shape] = None   # `#[serde(flatten)]`: the keys no field claims, as one value

    def check(self, value, path, doc):
        if not isinstance(value, dict):
            raise self.wrong_type(value, path, doc, f"struct {self.name}")
        by_key = {}
        for spec in self.fields:
            for key in (spec.name, *spec.aliases):
                by_key[key] = spec
        seen, rest = set(), {}
        for key, child in value.items():
            spec = by_key.get(key)
            if spec is None:
                rest[key] = child
                continue
            if spec.name in seen:
                raise SerdeError(path_text(path), f"duplicate field `{spec.name}`", doc.key_ends[path + (key,)] + 1)
            seen.add(spec.name)
            spec.shape.check(child, path + (key,), doc)
        closing = doc.spans[path][1] + 1
        for spec in self.fields:
            if spec.required and spec.name not in seen:
                raise SerdeError(path_text(path), f"missing field `{spec.name}`", closing)
        if self.flatten is not None:
            self.flatten.check_flat(rest, path, doc, closing)


@dataclass
class Untagged(Shape):
    """`#[serde(untagged)]` enum of struct variants, here only behind `#[serde(flatten)]`: the first variant whose
    fields the leftover keys hold wins; none holding them is one error at the enclosing object's close."""

    name: str
    variants: list   # Struct shapes

    def matches(self, rest: dict) -> bool:
        return any(holds(variant, rest) for variant in self.variants)

    def check_flat(self, rest: dict, path: tuple, doc: Layout, closing: int) -> None:
        if not self.matches(rest):
            raise SerdeError(path_text(path), f"data did not match any variant of untagged enum {self.name}",
                             closing)


@dataclass
class Tagged(Shape):
    """`#[serde(tag = "type")]`: the tag picks the struct variant (here only inside an untagged enum's attempt,
    so only whether it holds matters)."""

    tag: str
    variants: dict   # tag value -> Struct


@dataclass
class OneOf(Shape):
    """An untagged enum nested inside another's attempt: only whether some variant holds matters."""

    options: list


def _holds(shape: Shape, value) -> None:
    """Raise _NoMatch unless `value` fits `shape` (no positions: serde discards an untagged attempt's error)."""
    if isinstance(shape, OneOf):
        for option in shape.options:
            try:
                _holds(option, value)
                return
            except _NoMatch:
                continue
        raise _NoMatch()
    if isinstance(shape, Tagged):
        if not isinstance(value, dict) or value.get(shape.tag) not in shape.variants:
            raise _NoMatch()
        _holds(shape.variants[value[shape.tag]], {k: v for k, v in value.items() if k != shape.tag})
        return
    if isinstance(shape, Struct):
        if not isinstance(value, dict):
            raise _NoMatch()
        claimed = set()
        for spec in shape.fields:
            keys = [k for k in (spec.name, *spec.aliases) if k in value]
            if len(keys) > 1:
                raise _NoMatch()
            if keys:
                claimed.add(keys[0])
                _holds(spec.shape, value[keys[0]])
            elif spec.required:
                raise _NoMatch()
        if shape.flatten is not None and not shape.flatten.matches(
                {k: v for k, v in value.items() if k not in claimed}):
            raise _NoMatch()
        return
    if isinstance(shape, Seq):
        if value is None and shape.nullable:
            return
        if not isinstance(value, list):
            raise _NoMatch()
        for child in value:
            _holds(shape.item, child)
        return
    if isinstance(shape, UnitEnum):
        if not (isinstance(value, str) and value in shape.variants):
            raise _NoMatch()
        return
    if not shape.accepts(value):
        raise _NoMatch()


def holds(shape: Shape, value) -> bool:
    """Whether `value` fits `shape` (an untagged enum's question: which variant holds the data)."""
    try:
        _holds(shape, value)
        return True
    except _NoMatch:
        return False


def path_text(path: tuple) -> str:
    """serde_path_to_error's path: `messages[1].role`, `.` for the document itself."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "."


def first_error(shape: Shape, value, separators=(",", ":"), ensure_ascii=False) -> Optional[SerdeError]:
    """The error serde_json gives reading `value` (serialised with these separators) as `shape`, or None. A body
    that holds costs one walk; only a refused one is serialised to find serde's column (a render's hot path)."""
    if holds(shape, value):
        return None
    doc = layout(value, separators, ensure_ascii)
    try:
        shape.check(value, (), doc)
    except SerdeError as exc:
        return exc
    return None
