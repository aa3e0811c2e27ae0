"""Byte provenance: which template line and construct produced each output byte.

The tracing environment compiles the template with TracingCodeGenerator, so every emitted chunk is a
`Traced` string: a str subclass carrying character spans (start, end, lineno, construct). Spans survive:
  - macros, caller() bodies, `{% set x %}` blocks and filter blocks (their buffers are joined by a concat
    that merges the parts' spans);
  - `~` concatenation and `+` on strings (operands keep their spans; plain operands are attributed to the
    construct that finally outputs them);
  - filters whose result is a contiguous piece of a traced input (trim, truncate, string, first...): the
    piece keeps the input's spans (located at the first occurrence, which is exact for strip/trim since
    the piece starts at the first character that was not stripped).
Anything else (upper, replace, tojson, a str method...) produces plain text that is attributed to the
outermost construct that outputs it, e.g. `{{ render_content(m)|upper }}` -> (that line, "filter:upper").
A chunk whose spans do not cover it fully gets the gaps filled by the outputting construct, so the final
spans cover every byte exactly once. Offsets are converted to UTF-8 bytes at the end.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from jinja2.utils import _PassArg

from . import bounds
from .environment import ChatTemplateEnvironment, _budget

RawSpan = Tuple[int, int, int, str]  # (start char, end char, template line, construct)


@dataclass(frozen=True)
class Span:
    """Output bytes [start, end) came from template line `lineno` via `construct`."""

    start: int
    end: int
    lineno: int
    construct: str

    def to_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "lineno": self.lineno, "construct": self.construct}


class Traced(str):
    """A string that remembers where its characters came from (spans may leave gaps)."""

    __slots__ = ("_spans",)

    def __new__(cls, text="", spans: Sequence[RawSpan] = ()):
        self = super().__new__(cls, text)
        self._spans = tuple(spans)
        return self


def _spans_of(value) -> Tuple[RawSpan, ...]:
    return value._spans if isinstance(value, Traced) else ()


def _fill(text: str, spans: Sequence[RawSpan], lineno: int, construct: str) -> List[RawSpan]:
    """Spans covering all of `text`: the given ones, gaps attributed to (lineno, construct)."""
    out: List[RawSpan] = []
    position = 0
    for start, end, line, name in spans:
        if start > position:
            out.append((position, start, lineno, construct))
        out.append((start, end, line, name))
        position = end
    if position < len(text):
        out.append((position, len(text), lineno, construct))
    return out


def _join(parts: Iterable, lineno: Optional[int] = None, construct: str = "") -> Traced:
    texts: List[str] = []
    spans: List[RawSpan] = []
    offset = 0
    for part in parts:
        text = part if isinstance(part, str) else str(part)
        if isinstance(part, Traced):
            spans.extend((s + offset, e + offset, line, name) for s, e, line, name in part._spans)
        elif lineno is not None and text:
            spans.append((offset, offset + len(text), lineno, construct))
        texts.append(text)
        offset += len(text)
    return Traced("".join(texts), spans)


def _slice_spans(spans: Sequence[RawSpan], start: int, end: int) -> List[RawSpan]:
    out = []
    for s, e, line, name in spans:
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            out.append((lo - start, hi - start, line, name))
    return out


def _traced_filter(func):
    pass_arg = _PassArg.from_obj(func)
    value_index = 0 if pass_arg is None else 1

    def traced(*args, **kwargs):
        result = func(*args, **kwargs)
        if len(args) > value_index:
            source = args[value_index]
            if isinstance(source, Traced) and isinstance(result, str) and not isinstance(result, Traced) and result:
                at = source.find(result)
                if at >= 0:
                    return Traced(result, _slice_spans(source._spans, at, at + len(result)))
        return result

    traced.__dict__.update(getattr(func, "__dict__", {}))
    traced.__name__ = getattr(func, "__name__", "filter")
    return traced


class TracingEnvironment(ChatTemplateEnvironment):
    def __init__(self, **options):
        super().__init__(**options)
        from .codegen import TracingCodeGenerator

        self.code_generator_class = TracingCodeGenerator
        self.filters = {name: _traced_filter(func) for name, func in self.filters.items()}

    @staticmethod
    def concat(parts):
        parts = list(parts)
        budget = _budget.get()
        if budget is not None:
            bounds.over(sum(len(p) for p in parts if isinstance(p, str)), budget.max_value, "a macro or block")
        return _join(parts)

    @staticmethod
    def traced_str_join(parts, lineno):
        result = _join(parts, lineno, "op:concat")
        budget = _budget.get()
        if budget is not None:
            budget.check()
            budget.check_size(result, "operator '~'")
        return result

    @staticmethod
    def trace_out(value, lineno, construct):
        if isinstance(value, Traced):
            return Traced(value, _fill(value, value._spans, lineno, construct))
        text = ChatTemplateEnvironment.checked_str(value)
        return Traced(text, [(0, len(text), lineno, construct)] if text else [])

    @staticmethod
    def trace_const(text, lineno, construct):
        return Traced(text, [(0, len(text), lineno, construct)] if text else [])

    def call_binop(self, context, op, left, right):
        result = super().call_binop(context, op, left, right)
        if op == "+" and isinstance(result, str) and (isinstance(left, Traced) or isinstance(right, Traced)):
            return _join((left, right))
        return result



def chunks_to_spans(chunks: Sequence[str]) -> Tuple[str, List[Span]]:
    """Join top-level output chunks; return the text and byte spans covering every byte exactly once."""
    text_parts: List[str] = []
    spans: List[Span] = []
    byte_offset = 0
    for chunk in chunks:
        raw = _fill(chunk, _spans_of(chunk), 0, "unknown")
        for start, end, line, name in raw:
            size = len(chunk[start:end].encode("utf-8", "surrogatepass"))
            if spans and spans[-1].end == byte_offset and spans[-1].lineno == line and spans[-1].construct == name:
                spans[-1] = Span(spans[-1].start, byte_offset + size, line, name)
            else:
                spans.append(Span(byte_offset, byte_offset + size, line, name))
            byte_offset += size
        text_parts.append(str.__str__(chunk))
    return "".join(text_parts), spans


def origin_at(spans: Sequence[Span], byte_offset: int) -> Span:
    """The span holding output byte `byte_offset` (spans as returned by render_traced)."""
    starts = [span.start for span in spans]
    index = bisect.bisect_right(starts, byte_offset) - 1
    if index < 0 or not spans or byte_offset >= spans[index].end:
        raise IndexError(f"byte offset {byte_offset} is outside the rendered output "
                         f"({spans[-1].end if spans else 0} bytes)")
    return spans[index]
