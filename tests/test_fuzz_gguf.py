"""Fuzz the header-only GGUF reader: every input ends in a valid header or GGUFHeaderError, nothing else,
and no input makes it allocate more than the file holds."""
from __future__ import annotations

import struct
import tracemalloc

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runners.gguf_header import GGUFHeader, GGUFHeaderError, read_header

EXAMPLES = 2000
# Bookkeeping the reader may allocate on top of what the file holds (dicts, refs, exception text).
SLACK = 64 * 1024
TRIED = {"count": 0}


def _small_gguf(path) -> bytes:
    """A real GGUF written by gguf.GGUFWriter: a template, token list, scalars, arrays and one tensor."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_chat_template("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    writer.add_token_list([f"tok{i}" for i in range(100)] + ["<s>", "</s>"])
    writer.add_bos_token_id(100)
    writer.add_eos_token_id(101)
    writer.add_token_scores([float(i) for i in range(102)])
    writer.add_uint32("test.u32", 7)
    writer.add_bool("test.flag", True)
    writer.add_array("test.small", [1, 2, 3])
    writer.add_tensor("weight", np.ones((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory) -> bytes:
    return _small_gguf(tmp_path_factory.mktemp("gguf") / "small.gguf")


def _scratch(factory):
    # One directory reused by every example (a fresh one per example costs more than the read).
    if "dir" not in TRIED:
        TRIED["dir"] = factory.mktemp("fuzz")
    return TRIED["dir"]


def _read(tmp_path, data: bytes):
    """read_header on the bytes; returns the header or the GGUFHeaderError. Checks the allocation bound."""
    TRIED["count"] += 1
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        result = read_header(path)
        if isinstance(result, GGUFHeader):
            for key in list(result.values):
                result.get(key)
            for which in ("bos", "eos"):
                result.special_token(which)
            result.chat_templates()
    except GGUFHeaderError as exc:
        result = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < len(data) + SLACK, f"peak allocation {peak} bytes for a {len(data)}-byte file"
    if isinstance(result, GGUFHeaderError):
        assert str(path) in str(result)
    return result


def test_real_file_reads(tmp_path, real_gguf):
    header = _read(tmp_path, real_gguf)
    assert isinstance(header, GGUFHeader)
    assert header.chat_templates()["default"].startswith("{% for m in messages %}")
    assert header.special_token("bos") == ("<s>", 100)
    assert header.special_token("eos") == ("</s>", 101)
    # The reader agrees with gguf's own reader on every scalar it decodes.
    reference = gguf.GGUFReader(str(tmp_path / "fuzz.gguf"))
    assert reference.fields["test.u32"].parts[-1][0] == header.get("test.u32") == 7


def _counted(name: str, property_test, minimum: int) -> None:
    """Run a hypothesis property test, then print and check how many inputs reached the reader."""
    before = TRIED["count"]
    property_test()
    tried = TRIED["count"] - before
    print(f"\nGGUF header fuzz, {name}: {tried} inputs tried")
    assert tried >= minimum


def test_mutations_of_a_real_file(tmp_path_factory, real_gguf):
    _counted("mutations of a real file", lambda: _mutations(tmp_path_factory, real_gguf), EXAMPLES)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def _mutations(tmp_path_factory, real_gguf, data):
    tmp_path = _scratch(tmp_path_factory)
    blob = bytearray(real_gguf)
    kind = data.draw(st.sampled_from(["truncate", "flip", "overwrite-u64", "overwrite-u32", "splice"]))
    if kind == "truncate":
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            at = data.draw(st.integers(0, len(blob) - 1))
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "overwrite-u64":
        # Counts and string lengths are u64: huge, off-by-one and negative-looking values.
        at = data.draw(st.integers(0, len(blob) - 8))
        value = data.draw(st.one_of(st.sampled_from([0, 1, 2**63, 2**64 - 1, 2**32, len(blob)]),
                                    st.integers(0, 2**64 - 1)))
        struct.pack_into("<Q", blob, at, value)
    elif kind == "overwrite-u32":
        # Value types and the version are u32: unknown types, nested arrays, wrong versions.
        at = data.draw(st.integers(0, len(blob) - 4))
        struct.pack_into("<I", blob, at, data.draw(st.integers(0, 2**32 - 1)))
    else:
        at = data.draw(st.integers(0, len(blob)))
        blob[at:at] = data.draw(st.binary(max_size=64))
    _read(tmp_path, bytes(blob))


def test_synthetic_headers(tmp_path_factory):
    _counted("synthetic headers", lambda: _synthetic(tmp_path_factory), EXAMPLES // 4)


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(version=st.integers(0, 2**32 - 1), tensors=st.integers(0, 2**64 - 1), kv_count=st.integers(0, 2**64 - 1),
       body=st.binary(max_size=256), big_endian=st.booleans(), magic=st.sampled_from([b"GGUF", b"GGUG", b"FUGG", b""]))
def _synthetic(tmp_path_factory, version, tensors, kv_count, body, big_endian, magic):
    order = ">" if big_endian else "<"
    blob = magic + struct.pack(order + "IQQ", version, tensors, kv_count) + body
    result = _read(_scratch(tmp_path_factory), blob)
    if isinstance(result, GGUFHeader):
        assert result.version in (2, 3)


def _kv(key: bytes, value_type: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", value_type) + payload


def test_wrong_value_types_and_huge_lengths(tmp_path_factory):
    _counted("wrong value types and huge lengths", lambda: _wrong_types(tmp_path_factory), 3 * (EXAMPLES // 4))


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(value_type=st.integers(0, 40), item_type=st.integers(0, 40), count=st.integers(0, 2**64 - 1),
       length=st.integers(0, 2**64 - 1), payload=st.binary(max_size=128))
def _wrong_types(tmp_path_factory, value_type, item_type, count, length, payload):
    entries = [
        _kv(b"a.value", value_type, payload),
        _kv(b"a.array", 9, struct.pack("<IQ", item_type, count) + payload),
        _kv(b"a.string", 8, struct.pack("<Q", length) + payload),
    ]
    for entry in entries:
        blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + entry
        _read(_scratch(tmp_path_factory), blob)
