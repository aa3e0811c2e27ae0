"""llama.cpp's own autoparser analysis, read from a real llama-server b11434's start-up log, and its agreement
field by field with the capability goldens."""
from __future__ import annotations

import pytest

from conformance.analysis.agreement import (
    ANALYSIS_PREFIX,
    engine_agreement,
    summarize_agreement,
)
from conformance.corpus.manifest import load_corpus
from runners.llamacpp import LlamaCppRunner, build_llama_server


@pytest.fixture(scope="module")
def runner():
    build_llama_server()
    with LlamaCppRunner(timeout=20.0, workers=1) as r:
        yield r


def analysis(runner, template_id):
    entry = load_corpus().get(template_id)
    return runner.template_analysis(entry.source(), entry.bos_token, entry.eos_token)


def test_glm_analysis_fields(runner):
    found = analysis(runner, "glm-4.6")
    assert found["specialized"] is None
    fields = found["fields"]
    assert fields["tool_mode"] == "TAG_WITH_TAGGED" and fields["reasoning_mode"] == "TAG_BASED"
    assert (fields["per_call_start"], fields["per_call_end"]) == ("<tool_call>", "</tool_call>")
    assert fields["arg_name_prefix"] == "<arg_key>" and fields["arg_value_suffix"] == "</arg_value>\n"
    assert fields["user_msg_start"] == "<|user|>"
    assert "preserved_tokens" in found["not_logged"]


def test_specialized_templates_have_no_analysis(runner):
    found = analysis(runner, "qwen-qwen3-coder-30b-a3b-instruct")
    assert found["fields"] is None and found["specialized"] == "Qwen3-Coder"


def test_a_template_llamacpp_cannot_parse_has_no_analysis(runner):
    assert runner.template_analysis("{{ messages[0].content }", None, None) is None


def test_capabilities_reuse_the_analysis_server(runner):
    entry = load_corpus().get("qwen-qwen2.5-7b-instruct")
    starts = runner.server_starts
    runner.template_analysis(entry.source(), entry.bos_token, entry.eos_token)
    caps = runner.template_capabilities(entry.source(), entry.bos_token, entry.eos_token)
    assert caps["supports_tool_calls"] is True
    assert runner.server_starts == starts  # /props came from the analysis server, no pooled server started


def test_agreement_per_field(runner):
    corpus = load_corpus()
    templates = [corpus.get(t) for t in ("glm-4.6", "mistral-small-3.2-24b-instruct-2506",
                                         "qwen-qwen3-coder-30b-a3b-instruct")]
    section = summarize_agreement(engine_agreement(templates, runner))
    notes = section["autoparser"]
    assert (notes["analysed"], notes["specialized"], notes["unavailable"]) == (2, 1, 0)
    rows = {k[len(ANALYSIS_PREFIX):]: v for k, v in section["capabilities"].items() if k.startswith(ANALYSIS_PREFIX)}
    for name in ("per_call_start", "tool_mode", "arg_name_prefix", "call_id_pos", "user_msg_start"):
        assert rows[name]["agree"] == 2 and rows[name]["unknown"] == 1, (name, rows[name])
    # a field llama.cpp never logs is unknown on every template
    assert rows["preserved_tokens"]["unknown"] == 3 and rows["preserved_tokens"]["compared"] == 0
    # JSON field names apply to JSON-native calls only
    assert rows["name_field"]["compared"] == 0
