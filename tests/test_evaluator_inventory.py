"""Construct inventory, the construct catalogue, and the GGUF header reader."""
from __future__ import annotations

import struct

import pytest
from test_evaluator_support import real_templates

from runners.evaluator import ChatTemplate, TemplateCompileError, inventory
from runners.evaluator.gguf import GGUFError
from runners.evaluator.inventory import catalogue, describe

SOURCE = """{#- header -#}
{%- set ns = namespace(last=-1) %}
{%- macro walk(x) %}{% for y in x %}{{ walk(y) }}{% endfor %}{% endmacro %}
{%- for m in messages if m.role != 'tool' %}
  {%- if loop.first and m.role == 'system' %}{{ m.content.strip()|trim }}
  {%- elif m.content is string %}{{ '<|' ~ m.role ~ '|>' + m.content[1:] }}
  {%- else %}{{ raise_exception('bad ' ~ m.role) }}{% endif %}
  {%- set ns.last = loop.index0 // 2 %}
  {%- if loop.last %}{% break %}{% endif %}
{%- endfor %}
{%+ set block %}{{ tools|tojson(indent=2) }}{% endset %}
{% call walk([]) %}x{% endcall %}{% generation %}{{ strftime_now('%Y') }}{% endgeneration %}
{{ {'a': [1, 2.5, none, true]}.items()|list }}{{ '\\n' }}
"""


def test_inventory_names_and_lines():
    inv = inventory(SOURCE)
    expected = {
        "stmt:set-namespace": (8,), "stmt:macro": (3,), "stmt:macro-recursive": (3,), "stmt:for": (3, 4),
        "stmt:for-filtered": (4,), "loop:first": (5,), "loop:index0": (8,), "loop:last": (9,), "stmt:break": (9,),
        "method:strip": (5,), "filter:trim": (5,), "test:string": (6,), "op:concat": (6, 7), "op:add": (6,),
        "op:slice": (6,), "global:raise_exception": (7,), "op:floordiv": (8,), "stmt:set-block": (11,),
        "filter:tojson": (11,), "stmt:call": (12,), "stmt:generation": (12,), "global:strftime_now": (12,),
        "global:namespace": (2,), "literal:dict": (13,), "literal:float": (13,), "literal:none": (13,),
        "literal:bool": (13,), "method:items": (13,), "filter:list": (13,), "literal:str-escape": (13,),
        "syntax:comment": (1,), "ws:trim-left": (1, 2, 3, 4, 5, 6, 7, 8, 9, 10), "ws:trim-right": (1,),
        "ws:keep-left": (11,), "op:ne": (4,), "op:eq": (5,), "stmt:elif": (6,), "stmt:else": (5,),
        "var:messages": (4,), "var:tools": (11,), "call:macro": (3, 12),
    }
    for name, lines in expected.items():
        assert inv.lines(name) == lines, name
    assert "call:macro" in inv.at_line(12)


def test_inventory_refuses_broken_templates_with_the_line():
    with pytest.raises(TemplateCompileError) as error:
        inventory("ok\n{% if %}")
    assert error.value.lineno == 2


def test_every_corpus_construct_is_catalogued():
    templates = real_templates()
    if not templates:
        pytest.skip("no real templates available")
    entries = catalogue()["constructs"]
    for entry in entries.values():
        assert entry["summary"] and entry["example"]
    for template_id in sorted(templates)[::4]:  # a quarter of the corpus: parsing all of it takes minutes
        for name in inventory(templates[template_id]).names():
            if name.startswith("var:"):
                continue
            assert name in entries or name.split(":")[0] + ":*" in entries, name
            assert describe(name)["summary"]


def _gguf_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _write_gguf(path, entries):
    """A minimal GGUF v3 file: header + key/values (no tensors)."""
    body = b""
    for key, kind, payload in entries:
        body += _gguf_string(key) + struct.pack("<I", kind) + payload
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + body)


def test_from_gguf_reads_template_and_tokens(tmp_path):
    tokens = struct.pack("<IQ", 8, 3) + b"".join(_gguf_string(t) for t in ("<unk>", "<s>", "</s>"))
    path = tmp_path / "model.gguf"
    _write_gguf(path, [
        ("general.architecture", 8, _gguf_string("llama")),
        ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0, 0, 0)),
        ("tokenizer.ggml.tokens", 9, tokens),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        ("tokenizer.chat_template", 8, _gguf_string("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")),
    ])
    template = ChatTemplate.from_gguf(path)
    assert (template.bos_token, template.eos_token, template.builtin_fallback) == ("<s>", "</s>", False)
    assert template.render([{"role": "user", "content": "hé"}], bos_token="<s>", eos_token="</s>") == "<s>hé</s>"


def test_from_gguf_without_template_uses_builtin_chatml(tmp_path):
    path = tmp_path / "bare.gguf"
    _write_gguf(path, [("general.architecture", 8, _gguf_string("llama"))])
    with pytest.warns(UserWarning, match="builtin ChatML"):
        template = ChatTemplate.from_gguf(path)
    assert template.builtin_fallback and "builtin ChatML" in template.origin
    assert template.render([{"role": "user", "content": "x"}], add_generation_prompt=True) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_truncated_gguf_names_file_and_offset(tmp_path):
    path = tmp_path / "cut.gguf"
    _write_gguf(path, [("tokenizer.chat_template", 8, _gguf_string("{{ x }}" * 10))])
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(GGUFError, match=r"cut\.gguf: malformed GGUF at byte offset \d+"):
        ChatTemplate.from_gguf(path)
    path.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(GGUFError, match="missing GGUF magic"):
        ChatTemplate.from_gguf(path)
