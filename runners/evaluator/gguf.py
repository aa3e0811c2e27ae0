"""Read a chat template (and the bos/eos token texts) from a GGUF file's key/value header. Standard library only.

Only the header is read: scalars and strings are decoded, arrays are skipped by seeking (string arrays item
by item, fixed-size arrays in one seek), and a token text is found by walking tokenizer.ggml.tokens up to
its index. The tensor section is never touched. Every malformed input ends in GGUFError naming the file and
the byte offset; no read goes past the end of the file and no allocation is larger than the file.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
TEMPLATE_KEY = "tokenizer.chat_template"
TOKENS_KEY = "tokenizer.ggml.tokens"
BOS_KEY = "tokenizer.ggml.bos_token_id"
EOS_KEY = "tokenizer.ggml.eos_token_id"

# GGUF value types -> (struct code, size) for fixed-size scalars; 8 = string, 9 = array.
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    def __init__(self, path, offset: int, problem: str):
        super().__init__(f"{path}: malformed GGUF at byte offset {offset}: {problem}")
        self.path = str(path)
        self.offset = offset
        self.problem = problem


@dataclass(frozen=True)
class GGUFTemplate:
    key: str
    template: Optional[str]
    bos_token: Optional[str]
    eos_token: Optional[str]


class _Reader:
    def __init__(self, path, data):
        self.path = path
        self.data = data
        self.pos = 0
        self.order = "<"

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise GGUFError(self.path, self.pos, f"needs {size} bytes but the file ends at {len(self.data)}")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def scalar(self, code: str, size: int):
        return struct.unpack(self.order + code, self.take(size))[0]

    def string(self) -> str:
        at = self.pos
        raw = self.take(self.scalar("Q", 8))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(self.path, at, f"string is not UTF-8: {exc}") from None

    def skip_string(self) -> None:
        size = self.scalar("Q", 8)
        self._seek(size)

    def _seek(self, size: int) -> None:
        if self.pos + size > len(self.data):
            raise GGUFError(self.path, self.pos, f"value of {size} bytes runs past the end of the file")
        self.pos += size

    def value(self, kind: int, key: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(*_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = self.scalar("I", 4)
            count = self.scalar("Q", 8)
            start = self.pos
            if item_kind in _SCALARS:
                self._seek(count * _SCALARS[item_kind][1])
            elif item_kind == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                raise GGUFError(self.path, start, f"array {key!r} has unsupported item type {item_kind}")
            return ("array", item_kind, count, start)
        raise GGUFError(self.path, self.pos - 4, f"key {key!r} has unknown value type {kind}")


def read_header(path) -> Tuple[int, Dict[str, Any]]:
    """(version, {key: value}); arrays are ("array", item_type, count, offset) placeholders."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 24:
            raise GGUFError(path, 0, f"file is {size} bytes, too small for a GGUF header")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read(path, data)[:2]


def _read(path, data):
    reader = _Reader(path, data)
    if reader.take(4) != MAGIC:
        raise GGUFError(path, 0, "missing GGUF magic")
    version = reader.scalar("I", 4)
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in SUPPORTED_VERSIONS:
            reader.order, version = ">", swapped
        else:
            raise GGUFError(path, 4, f"unsupported GGUF version {version} (supported: {SUPPORTED_VERSIONS})")
    reader.scalar("Q", 8)  # tensor count
    kv_count = reader.scalar("Q", 8)
    if kv_count > len(data):
        raise GGUFError(path, 16, f"key/value count {kv_count} is larger than the file")
    values: Dict[str, Any] = {}
    for _ in range(kv_count):
        key = reader.string()
        kind = reader.scalar("I", 4)
        values[key] = reader.value(kind, key)
    return version, values, reader


def _token_text(path, data, reader: _Reader, tokens, token_id) -> Optional[str]:
    if not (isinstance(tokens, tuple) and tokens[1] == _STRING) or not isinstance(token_id, int):
        return None
    if not 0 <= token_id < tokens[2]:
        raise GGUFError(path, tokens[3], f"token id {token_id} is outside {TOKENS_KEY} ({tokens[2]} items)")
    reader.pos = tokens[3]
    for _ in range(token_id):
        reader.skip_string()
    return reader.string()


def read_chat_template(path, name: Optional[str] = None) -> GGUFTemplate:
    """The template under tokenizer.chat_template (or .<name>), with bos/eos texts when the file has them."""
    key = TEMPLATE_KEY if name is None else f"{TEMPLATE_KEY}.{name}"
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise GGUFError(path, 0, f"cannot open: {exc.strerror}") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 24:
            raise GGUFError(path, 0, f"file is {size} bytes, too small for a GGUF header")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _, values, reader = _read(path, data)
            template = values.get(key)
            if template is not None and not isinstance(template, str):
                raise GGUFError(path, 0, f"{key} is not a string")
            tokens = values.get(TOKENS_KEY)
            bos = _token_text(path, data, reader, tokens, values.get(BOS_KEY))
            eos = _token_text(path, data, reader, tokens, values.get(EOS_KEY))
    return GGUFTemplate(key, template, bos, eos)
