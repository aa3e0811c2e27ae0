"""Byte-level comparison of an engine's output with a golden, shown with whitespace and escapes visible."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

CONTEXT = 40
_VISIBLE = {0x0A: "\\n\n", 0x0D: "\\r", 0x09: "\\t", 0x20: "·", 0x5C: "\\\\"}


def first_difference(expected: bytes, actual: bytes) -> Optional[int]:
    """Offset of the first differing byte, or None when equal (a prefix differs at the shorter's end)."""
    if expected == actual:
        return None
    limit = min(len(expected), len(actual))
    # Compare in blocks first: goldens reach hundreds of KB and most of them match.
    lo = 0
    step = 4096
    while lo < limit and expected[lo:lo + step] == actual[lo:lo + step]:
        lo += step
    end = min(limit, lo + step)
    if expected[lo:end] == actual[lo:end]:
        return limit  # the block differed past the shorter's end only
    # Halve the differing block by comparing slices (memcmp), not byte by byte in Python: [lo, end) holds the
    # first difference and everything before lo is equal.
    while end - lo > 1:
        middle = (lo + end) // 2
        if expected[lo:middle] == actual[lo:middle]:
            lo = middle
        else:
            end = middle
    return lo


def _visible_table(newline_breaks: bool) -> dict:
    table = {code: shown if newline_breaks or code != 0x0A else "\\n" for code, shown in _VISIBLE.items()}
    for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, 0xFEFF, 0x200B]:
        table.setdefault(code, f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}")
    return table


_VISIBLE_TABLES = {False: _visible_table(False), True: _visible_table(True)}


def visible(data: bytes, newline_breaks: bool = False) -> str:
    """Bytes as readable text: spaces as ·, control characters and invalid UTF-8 as escapes."""
    return data.decode("utf-8", "backslashreplace").translate(_VISIBLE_TABLES[newline_breaks])


@dataclass(frozen=True)
class Divergence:
    offset: int
    expected_len: int
    actual_len: int
    expected_context: str
    actual_context: str
    line: int   # 1-based line of the offset in the golden
    column: int

    def describe(self) -> str:
        return (f"first difference at byte {self.offset} (golden line {self.line}, column {self.column}; "
                f"golden {self.expected_len} bytes, output {self.actual_len} bytes)\n"
                f"  golden: {self.expected_context}\n  output: {self.actual_context}")

    def to_dict(self) -> dict:
        return {"offset": self.offset, "expected_len": self.expected_len, "actual_len": self.actual_len,
                "expected_context": self.expected_context, "actual_context": self.actual_context,
                "line": self.line, "column": self.column}


def compare_bytes(expected: bytes, actual: bytes, context: int = CONTEXT) -> Optional[Divergence]:
    offset = first_difference(expected, actual)
    if offset is None:
        return None
    prefix = expected[:offset]
    line = prefix.count(b"\n") + 1
    column = offset - (prefix.rfind(b"\n") + 1) + 1

    def show(data: bytes) -> str:
        start = max(0, offset - context)
        while start > 0 and start < len(data) and (data[start] & 0xC0) == 0x80:
            start -= 1
        before, after = data[start:offset], data[offset:offset + context]
        lead = "…" if start > 0 else ""
        tail = "…" if offset + context < len(data) else ("⟨end⟩" if offset >= len(data) else "")
        return f"{lead}{visible(before)}⟦{visible(after)}{tail}"

    return Divergence(offset, len(expected), len(actual), show(expected), show(actual), line, column)
