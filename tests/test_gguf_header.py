"""The header-only GGUF reader on the real vocab files of llama.cpp and on files written here."""
from __future__ import annotations

import gguf
import pytest

from runners.gguf_header import GGUFHeaderError, read_header


def test_named_templates_and_special_tokens_of_command_r(llamacpp_models):
    header = read_header(llamacpp_models / "ggml-vocab-command-r.gguf")
    templates = header.chat_templates()
    assert set(templates) == {"default", "tool_use", "rag"}
    assert header.special_token("bos") == ("<BOS_TOKEN>", 5)
    assert header.special_token("eos") == ("<|END_OF_TURN_TOKEN|>", 255001)


def test_agrees_with_gguf_reader_on_real_files(llamacpp_models):
    for name in ("ggml-vocab-phi-3.gguf", "ggml-vocab-llama-spm.gguf"):
        path = llamacpp_models / name
        ours = read_header(path)
        reader = gguf.GGUFReader(path)
        tokens = reader.fields["tokenizer.ggml.tokens"]
        for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            field = reader.fields[key]
            token_id = int(field.parts[field.data[0]][0])
            assert ours.get(key) == token_id
            assert ours.string_array_item("tokenizer.ggml.tokens", token_id) == bytes(tokens.parts[tokens.data[token_id]]).decode()
        if "tokenizer.chat_template" in reader.fields:
            field = reader.fields["tokenizer.chat_template"]
            assert ours.chat_templates()["default"] == bytes(field.parts[field.data[0]]).decode()


def _write(path, template=None, named=None):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(100)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if template is not None:
        writer.add_chat_template(template if named is None else [{"name": "default", "template": template}, *named])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_written_file_with_named_templates(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "{{ messages }}", named=[{"name": "tool_use", "template": "{{ tools }}"}])
    header = read_header(path)
    assert header.chat_templates() == {"default": "{{ messages }}", "tool_use": "{{ tools }}"}
    assert header.special_token("bos") == ("<s>", 1)


@pytest.mark.parametrize("cut", [0, 3, 7, 15, 23, 40, 100, -1])
def test_truncated_files_name_the_file_and_offset(tmp_path, cut):
    full = tmp_path / "full.gguf"
    _write(full, "{{ x }}")
    data = full.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:len(data) // 2])
    with pytest.raises(GGUFHeaderError) as info:
        read_header(bad)
    assert str(bad) in str(info.value) and "offset" in str(info.value)


def test_bad_magic_and_version(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(GGUFHeaderError, match="bad magic"):
        read_header(path)
    path.write_bytes(b"GGUF" + (99).to_bytes(4, "little") + b"\0" * 40)
    with pytest.raises(GGUFHeaderError, match="unsupported GGUF version 99"):
        read_header(path)


def test_a_duplicate_key_is_refused_as_llama_cpp_refuses_it(tmp_path):
    """Two values for tokenizer.chat_template: llama.cpp's reader refuses the file; so does ours, at the byte
    of the second key, instead of taking the last value."""
    import struct

    def string(text):
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    def kv(key, value):
        return string(key) + struct.pack("<I", 8) + string(value)  # 8: a string value

    pairs = [kv("general.architecture", "llama"), kv("tokenizer.chat_template", "{{ first }}"),
             kv("tokenizer.chat_template", "{{ second }}")]
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs))
    path = tmp_path / "dup.gguf"
    path.write_bytes(head + b"".join(pairs))
    with pytest.raises(GGUFHeaderError, match="duplicate key 'tokenizer.chat_template'") as raised:
        read_header(path)
    assert str(len(head) + len(pairs[0]) + len(pairs[1])) in str(raised.value)
    path.write_bytes(head[:-8] + struct.pack("<Q", 2) + pairs[0] + pairs[1])
    assert read_header(path).chat_templates() == {"default": "{{ first }}"}
