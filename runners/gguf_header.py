"""Read a GGUF file's key/value header without parsing the tensors or the big token arrays.

`gguf.GGUFReader` parses every array (token texts, scores, merges) into numpy objects, which took 1-20 s per
vocab file here. Chat templates and the bos/eos token texts need a handful of keys, so this reader walks the
header with struct offsets, seeks over arrays it does not need, and looks up single token texts lazily.

Every malformed input ends in GGUFHeaderError naming the file and the byte offset; no read goes past the
file's end and no allocation is larger than what the file actually holds.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

from gguf.constants import GGUF_MAGIC, GGUFValueType, Keys

SUPPORTED_VERSIONS = (2, 3)

# Fixed-size scalar types: (struct code, size).
_SCALARS = {
    GGUFValueType.UINT8: ("B", 1), GGUFValueType.INT8: ("b", 1),
    GGUFValueType.UINT16: ("H", 2), GGUFValueType.INT16: ("h", 2),
    GGUFValueType.UINT32: ("I", 4), GGUFValueType.INT32: ("i", 4),
    GGUFValueType.FLOAT32: ("f", 4), GGUFValueType.BOOL: ("?", 1),
    GGUFValueType.UINT64: ("Q", 8), GGUFValueType.INT64: ("q", 8),
    GGUFValueType.FLOAT64: ("d", 8),
}
# Arrays this many items or fewer are decoded eagerly (the rest are located and read on demand).
SMALL_ARRAY = 64

CHAT_TEMPLATE_KEY = Keys.Tokenizer.CHAT_TEMPLATE            # tokenizer.chat_template
CHAT_TEMPLATES_KEY = Keys.Tokenizer.CHAT_TEMPLATES          # tokenizer.chat_templates (list of names)
CHAT_TEMPLATE_NAMED_PREFIX = CHAT_TEMPLATE_KEY + "."         # tokenizer.chat_template.<name>


class GGUFHeaderError(ValueError):
    def __init__(self, path: str, offset: int, problem: str):
        super().__init__(f"{path}: malformed GGUF at byte offset {offset}: {problem}")
        self.path = path
        self.offset = offset
        self.problem = problem


@dataclass
class ArrayRef:
    item_type: int
    count: int
    offset: int          # where the first item starts
    items: Optional[list] = None  # decoded when small


@dataclass
class GGUFHeader:
    path: str
    version: int
    tensor_count: int
    byte_order: str
    values: dict = field(default_factory=dict)   # key -> scalar/str, or ArrayRef
    _data: Any = None

    def get(self, key: str, default=None):
        value = self.values.get(key, default)
        if isinstance(value, ArrayRef):
            return value.items if value.items is not None else value
        return value

    def string_array_item(self, key: str, index: int) -> Optional[str]:
        """The index-th string of a string array (e.g. a token text), read on demand."""
        ref = self.values.get(key)
        if not isinstance(ref, ArrayRef) or ref.item_type != GGUFValueType.STRING:
            return None
        if not 0 <= index < ref.count:
            raise GGUFHeaderError(self.path, ref.offset, f"{key} has {ref.count} items, no item {index}")
        if ref.items is not None:
            return ref.items[index]
        reader = _Reader(self._data, self.path, self.byte_order)
        reader.pos = ref.offset
        reader.skip_strings(index)
        return reader.string()

    def chat_templates(self) -> dict[str, str]:
        """Embedded templates: {"default": ..., "<name>": ...} from the default and named keys."""
        found = {}
        default = self.values.get(CHAT_TEMPLATE_KEY)
        if isinstance(default, str):
            found["default"] = default
        for key, value in self.values.items():
            if key.startswith(CHAT_TEMPLATE_NAMED_PREFIX) and isinstance(value, str):
                found[key[len(CHAT_TEMPLATE_NAMED_PREFIX):]] = value
        return found

    def template_key(self, name: str) -> str:
        return CHAT_TEMPLATE_KEY if name == "default" else CHAT_TEMPLATE_NAMED_PREFIX + name

    def special_token(self, which: str) -> tuple[Optional[str], Optional[int]]:
        """(text, id) of the bos/eos token, from tokenizer.ggml.<which>_token_id and the token list."""
        token_id = self.values.get(f"tokenizer.ggml.{which}_token_id")
        if not isinstance(token_id, int):
            return None, None
        return self.string_array_item(Keys.Tokenizer.LIST, token_id), token_id


class _Reader:
    def __init__(self, data, path: str, byte_order: str):
        self.data = data
        self.size = len(data)
        self.path = path
        self.bo = byte_order
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFHeaderError(self.path, self.pos,
                                  f"truncated: {what} needs {n} bytes, {self.size - self.pos} left")

    def scalar(self, value_type: int, what: str):
        code, size = _SCALARS[value_type]
        self.need(size, what)
        (value,) = struct.unpack_from(self.bo + code, self.data, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str = "string") -> str:
        start = self.pos
        length = self.u64(f"{what} length")
        self.need(length, f"{what} of {length} bytes")
        raw = bytes(self.data[self.pos:self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFHeaderError(self.path, start, f"{what} is not valid UTF-8 ({exc.reason})") from None

    def skip_string(self) -> None:
        self.skip_strings(1)

    def skip_strings(self, count: int) -> None:
        # The hot loop of the whole reader (merges hold ~10^5 strings): no per-item method calls or messages.
        data, size, pos = self.data, self.size, self.pos
        unpack = struct.Struct(self.bo + "Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                break
            pos += 8 + unpack(data, pos)[0]
            if pos > size:
                break
        else:
            self.pos = pos
            return
        raise GGUFHeaderError(self.path, min(pos, size), "truncated: a string runs past the end of the file")

    def value_type(self, what: str) -> int:
        at = self.pos
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFHeaderError(self.path, at, f"unknown value type {raw} for {what}") from None

    def value(self, value_type: int, key: str):
        if value_type == GGUFValueType.STRING:
            return self.string(f"value of {key}")
        if value_type == GGUFValueType.ARRAY:
            return self.array(key)
        return self.scalar(value_type, f"value of {key}")

    def array(self, key: str) -> ArrayRef:
        item_type = self.value_type(f"item type of {key}")
        count_at = self.pos
        count = self.u64(f"item count of {key}")
        if item_type == GGUFValueType.ARRAY:
            raise GGUFHeaderError(self.path, count_at - 12, f"{key}: nested arrays are not supported")
        min_item = 8 if item_type == GGUFValueType.STRING else _SCALARS[item_type][1]
        if count * min_item > self.size - self.pos:
            raise GGUFHeaderError(self.path, count_at,
                                  f"{key} claims {count} items, more than the file's remaining {self.size - self.pos} bytes hold")
        ref = ArrayRef(int(item_type), count, self.pos)
        if count <= SMALL_ARRAY:
            ref.items = [self.value(item_type, f"{key}[{i}]") for i in range(count)]
        elif item_type == GGUFValueType.STRING:
            self.skip_strings(count)
        else:
            self.pos += count * min_item
        return ref


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Read the key/value section of a GGUF file. Raises GGUFHeaderError (or OSError for unreadable files)."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 4:
            raise GGUFHeaderError(path, 0, f"file is {size} bytes, too short for a GGUF magic")
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return parse_header(data, path)


def parse_header(data, path: str = "<bytes>") -> GGUFHeader:
    if len(data) < 4 or struct.unpack_from("<I", data, 0)[0] != GGUF_MAGIC:
        raise GGUFHeaderError(path, 0, f"bad magic {bytes(data[:4])!r}, expected b'GGUF'")
    reader = _Reader(data, path, "<")
    reader.pos = 4
    version = reader.u32("version")
    if version not in SUPPORTED_VERSIONS:
        # A big-endian file stores its version byte-swapped.
        swapped = struct.unpack_from(">I", data, 4)[0]
        if swapped in SUPPORTED_VERSIONS:
            reader.bo, version = ">", swapped
        else:
            raise GGUFHeaderError(path, 4, f"unsupported GGUF version {version} (supported: 2, 3)")
    tensor_count = reader.u64("tensor count")
    kv_at = reader.pos
    kv_count = reader.u64("key/value count")
    # Each entry needs at least a key length, a value type and one byte of value.
    if kv_count * 13 > reader.size - reader.pos:
        raise GGUFHeaderError(path, kv_at, f"claims {kv_count} key/value pairs, more than the file can hold")
    header = GGUFHeader(path, version, tensor_count, reader.bo, _data=data)
    for index in range(kv_count):
        key_at = reader.pos
        key = reader.string(f"key #{index}")
        if key in header.values:  # llama.cpp refuses the file: which value would an engine use?
            raise GGUFHeaderError(path, key_at, f"duplicate key {key!r} (key #{index}); llama.cpp refuses such a "
                                                f"file")
        value_type = reader.value_type(f"type of {key}")
        header.values[key] = reader.value(value_type, key)
    return header
