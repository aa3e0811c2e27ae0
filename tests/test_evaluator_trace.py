"""Byte provenance: spans cover every output byte exactly once and name the line/construct that emitted it."""
from __future__ import annotations

import pytest
from test_evaluator_support import CONVERSATIONS, real_templates

from runners.evaluator import ChatTemplate, EvaluatorError, origin_at

TEMPLATES = real_templates()
# A spread of the corpus keeps this fast; the HF comparison covers every template.
SAMPLE = sorted(TEMPLATES)[::7]


def assert_exact_cover(traced, plain: str):
    data = plain.encode("utf-8")
    assert traced.text == plain and traced.data == data
    if not data:
        assert traced.spans == []
        return
    assert traced.spans[0].start == 0 and traced.spans[-1].end == len(data)
    for left, right in zip(traced.spans, traced.spans[1:]):
        assert left.end == right.start
    assert all(span.start < span.end and span.lineno >= 1 for span in traced.spans)


@pytest.mark.parametrize("template_id", SAMPLE)
def test_spans_cover_real_renders(template_id):
    template = ChatTemplate(TEMPLATES[template_id])
    lines = TEMPLATES[template_id].count("\n") + 1
    for conversation in CONVERSATIONS.values():
        if conversation.get("continue_final_message"):
            continue
        try:
            plain = template.render(**conversation)
        except EvaluatorError:
            continue
        traced = template.render_traced(**conversation)
        assert_exact_cover(traced, plain)
        assert all(span.lineno <= lines for span in traced.spans)


def spans_for(source, messages, **options):
    template = ChatTemplate.from_string(source)
    traced = template.render_traced(messages, **options)
    assert_exact_cover(traced, template.render(messages, **options))
    return traced


def origin_of(traced, needle: str):
    at = traced.data.index(needle.encode("utf-8"))
    return origin_at(traced.spans, at)


MESSAGES = [{"role": "user", "content": "héllo  "}, {"role": "assistant", "content": "wörld"}]


def test_tojson_bytes_come_from_the_tojson_line():
    traced = spans_for("<tools>\n{{ tools|tojson }}\n</tools>", MESSAGES, tools=[{"name": "f"}])
    span = origin_of(traced, '"name"')
    assert (span.lineno, span.construct) == (2, "filter:tojson")
    assert origin_of(traced, "<tools>").construct == "text:data"


def test_macro_output_is_attributed_inside_the_macro_even_through_trim():
    source = ("{% macro render_content(c) %}\n"
              "  [{{ c }}]  \n"
              "{% endmacro %}\n"
              "{% for m in messages %}{{ m.role }}={{ render_content(m.content)|trim }};{% endfor %}")
    traced = spans_for(source, MESSAGES)
    assert origin_of(traced, "héllo").lineno == 2 and origin_of(traced, "héllo").construct == "expr:variable"
    assert origin_of(traced, "[").lineno == 2
    assert origin_of(traced, "=").lineno == 4
    # bytes after the multi-byte characters are still located exactly (offsets are UTF-8 bytes)
    assert origin_of(traced, "wörld").construct == "expr:variable"


def test_call_block_set_block_and_filter_block():
    source = ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}\n"
              "{% call wrap() %}inside{% endcall %}\n"
              "{% set header %}HEAD{{ messages|length }}{% endset %}\n"
              "{{ header }}\n"
              "{% filter upper %}shout{% endfilter %}")
    traced = spans_for(source, MESSAGES)
    assert origin_of(traced, "inside").lineno == 2
    assert origin_of(traced, "<").lineno == 1
    assert origin_of(traced, "HEAD").lineno == 3
    assert (origin_of(traced, "2").lineno, origin_of(traced, "2").construct) == (3, "filter:length")
    assert (origin_of(traced, "SHOUT").lineno, origin_of(traced, "SHOUT").construct) == (5, "stmt:filter")


def test_concat_keeps_operand_provenance():
    traced = spans_for("{% macro tag(r) %}<{{ r }}>{% endmacro %}\n{{ tag('a') ~ '|' ~ messages[0].role }}", MESSAGES)
    assert origin_of(traced, "<a>").lineno == 1
    assert (origin_of(traced, "|").lineno, origin_of(traced, "|").construct) == (2, "op:concat")


def test_origin_at_rejects_offsets_outside_the_output():
    traced = spans_for("ab", MESSAGES)
    with pytest.raises(IndexError):
        origin_at(traced.spans, 2)
