"""Capability analysis pinned on templates whose answers are known, through the real reference runner."""
from __future__ import annotations

import json

import pytest

from conformance.analysis import capabilities as cap
from conformance.corpus.manifest import load_corpus
from runners.hf import HFRunner

KNOWN = [
    "qwen-qwen2.5-7b-instruct",
    "google-gemma-2-2b-it",
    "qwen-qwen3-0.6b",
    "qwen-qwen3-4b-thinking-2507",
    "meta-llama-llama-3.1-8b-instruct",
    "nousresearch-hermes-2-pro-llama-3-8b-tool_use",
    "qwen-qwen3-coder-30b-a3b-instruct",
    "mistralai-mistral-7b-instruct-v0.3",
    "llama-cpp-deepseek-r1",
    "glm-4.6",
    "mistral-small-3.2-24b-instruct-2506",
    "mistralai-mistral-nemo-instruct-2407",
    "cohereforai-c4ai-command-r7b-12-2024-tool_use",
    "deepseek-ai-deepseek-r1-distill-qwen-32b",
    "apertus-8b-instruct",
    "ibm-granite-granite-3.3-2b-instruct",
]


@pytest.fixture(scope="module")
def derived():
    corpus = load_corpus()
    runner = HFRunner(workers=1)
    try:
        results, failures = cap.compute_capabilities([corpus.get(t) for t in KNOWN], runner)
    finally:
        runner.close()
    assert not failures, failures
    return results


def test_chatml_generation_prompt_and_end_of_turn(derived):
    qwen = derived["qwen-qwen2.5-7b-instruct"]
    assert qwen["generation_prompt"] == {"mode": "appended", "text": "<|im_start|>assistant\n"}
    assert qwen["end_of_turn"] == "<|im_end|>\n"
    assert qwen["system_role"] == "own-turn"


def test_gemma2_refuses_system(derived):
    gemma = derived["google-gemma-2-2b-it"]
    assert gemma["system_role"] == "refused"
    assert gemma["generation_prompt"]["text"] == "<start_of_turn>model\n"
    assert gemma["end_of_turn"] == "<end_of_turn>\n"
    assert gemma["tools"]["definitions"] == "ignored"
    assert gemma["tools"]["format"] is None


def test_mistral_folds_system_and_has_no_generation_prompt(derived):
    mistral = derived["mistralai-mistral-7b-instruct-v0.3"]
    assert mistral["system_role"] == "folded"
    assert mistral["generation_prompt"] == {"mode": "none", "text": ""}
    assert mistral["tools"]["call_start"] == "[TOOL_CALLS]"


def test_qwen3_enable_thinking_false_adds_empty_think_block(derived):
    reasoning = derived["qwen-qwen3-0.6b"]["reasoning"]
    assert reasoning["rendered"] == "rendered"
    assert (reasoning["start"], reasoning["end"]) == ("<think>", "</think>")
    assert reasoning["enable_thinking"]["effect"] == "changes"
    assert reasoning["enable_thinking"]["when_false"] == "<think>\n\n</think>\n\n"
    assert reasoning["enable_thinking"]["when_true"] == ""
    assert reasoning["forced_open"] is False
    assert reasoning["past_turns"] == "stripped"


def test_qwen3_thinking_is_forced_open(derived):
    caps = derived["qwen-qwen3-4b-thinking-2507"]
    assert caps["generation_prompt"]["text"] == "<|im_start|>assistant\n<think>\n"
    assert caps["reasoning"]["forced_open"] is True


def test_deepseek_r1_markers_from_content_split(derived):
    """R4: reasoning_content is never rendered, but <think>..</think> is cut out of past content."""
    reasoning = derived["llama-cpp-deepseek-r1"]["reasoning"]
    assert reasoning["think_in_content_past"] == "stripped"
    assert (reasoning["start"], reasoning["end"]) == ("<think>", "</think>")
    assert reasoning["forced_open"] is True


def test_llama31_end_of_turn_and_single_calls(derived):
    llama = derived["meta-llama-llama-3.1-8b-instruct"]
    assert llama["end_of_turn"] == "<|eot_id|>"
    assert llama["generation_prompt"]["text"] == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert llama["tools"]["format"] == "json-native"
    assert llama["tools"]["parallel"] == "raised"


def test_hermes_tool_call_format(derived):
    """Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>: the name is a JSON value, so the
    seed's classification calls it JSON_NATIVE with a <tool_call> wrapper. The template refuses without tools."""
    hermes = derived["nousresearch-hermes-2-pro-llama-3-8b-tool_use"]
    assert hermes["requires_tools"] is True
    tools = hermes["tools"]
    assert (tools["format"], tools["call_start"], tools["call_end"]) == ("json-native", "<tool_call>", "</tool_call>")
    assert tools["parallel"] == "both" and tools["results"] == "rendered"


def test_qwen3_coder_tagged_arguments_need_objects(derived):
    tools = derived["qwen-qwen3-coder-30b-a3b-instruct"]["tools"]
    assert tools["format"] == "tag-tagged"
    assert tools["call_start"] == "<tool_call>\n<function="
    assert tools["call_end"] == "</function>\n</tool_call>"
    assert tools["arguments"]["object"] is True and tools["arguments"]["string"] is False


def test_diff_middle_does_not_split_tags():
    prefix, left, right, suffix = cap.diff_middle("A<|im_end|>", "A<tool_call>x</tool_call><|im_end|>")
    assert (prefix, left, right, suffix) == ("A", "", "<tool_call>x</tool_call>", "<|im_end|>")


def test_update_writes_canonical_json_once(tmp_path, derived):
    corpus = load_corpus()
    runner = HFRunner(workers=1)
    try:
        written, failures = cap.update_capability_goldens([corpus.get("qwen-qwen3-0.6b")], runner, root=tmp_path)
        again, _ = cap.update_capability_goldens([corpus.get("qwen-qwen3-0.6b")], runner, root=tmp_path)
    finally:
        runner.close()
    assert (written, failures, again) == (1, [], 0)
    raw = (tmp_path / "qwen-qwen3-0.6b" / "capabilities.json").read_bytes()
    assert raw.endswith(b"}\n") and raw == cap.encode_capabilities(json.loads(raw))
    assert cap.load_capabilities("qwen-qwen3-0.6b", tmp_path) == derived["qwen-qwen3-0.6b"]


def test_bad_golden_names_the_file(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "capabilities.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"x/capabilities.json: not valid JSON"):
        cap.load_capabilities("x", tmp_path)


def test_agreement_summary_rates():
    counts = {"supports_tools": {"agree": 3, "disagree": 1, "unknown": 2, "disagreements": []},
              "supports_system_role": {"agree": 0, "disagree": 0, "unknown": 5, "disagreements": []}}
    from conformance.analysis.agreement import summarize_agreement

    summary = summarize_agreement(counts)
    assert summary["capabilities"]["supports_tools"]["agreement"] == 0.75
    assert summary["capabilities"]["supports_tools"]["compared"] == 4
    assert summary["capabilities"]["supports_system_role"]["agreement"] is None


# --- seed-002 fields -------------------------------------------------------------------------------------------

def test_turn_starts(derived):
    assert derived["qwen-qwen2.5-7b-instruct"]["turns"] == {"user_start": "<|im_start|>user",
                                                           "assistant_start": "<|im_start|>assistant"}
    assert derived["meta-llama-llama-3.1-8b-instruct"]["turns"]["user_start"] == \
        "<|start_header_id|>user<|end_header_id|>"
    assert derived["mistralai-mistral-7b-instruct-v0.3"]["turns"] == {"user_start": "[INST]", "assistant_start": None}


def test_content_modes(derived):
    assert derived["qwen-qwen2.5-7b-instruct"]["content"] == {"mode": "plain", "start": None, "end": None}
    assert derived["cohereforai-c4ai-command-r7b-12-2024-tool_use"]["content"] == {
        "mode": "always-wrapped", "start": "<|START_RESPONSE|>", "end": "<|END_RESPONSE|>"}


def test_reasoning_mode_and_scope(derived):
    """R3 of seed-002: Command R7B shows reasoning only beside tool calls; DeepSeek-R1 never replays reasoning
    but its markers are known, so its reasoning is tag-based."""
    command = derived["cohereforai-c4ai-command-r7b-12-2024-tool_use"]["reasoning"]
    assert (command["scope"], command["mode"]) == ("tools-only", "tools-only")
    assert derived["qwen-qwen3-0.6b"]["reasoning"]["scope"] == "content-and-tools"
    distill = derived["deepseek-ai-deepseek-r1-distill-qwen-32b"]["reasoning"]
    assert (distill["scope"], distill["mode"]) == ("none", "tag-based")
    assert derived["qwen-qwen2.5-7b-instruct"]["reasoning"]["mode"] == "none"


def test_section_and_per_call_markers(derived):
    qwen = derived["qwen-qwen2.5-7b-instruct"]["tools"]
    assert (qwen["markers"], qwen["per_call_start"], qwen["per_call_end"]) == ("per-call", "<tool_call>", "</tool_call>")
    nemo = derived["mistralai-mistral-nemo-instruct-2407"]["tools"]
    assert (nemo["markers"], nemo["section_start"], nemo["per_call_start"]) == ("section", "[TOOL_CALLS]", None)
    deepseek = derived["deepseek-ai-deepseek-r1-distill-qwen-32b"]["tools"]
    assert deepseek["markers"] == "both"
    assert (deepseek["section_start"], deepseek["section_end"]) == ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    assert (deepseek["per_call_start"], deepseek["per_call_end"]) == ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    assert deepseek["function"] == {"name_prefix": "function<｜tool▁sep｜>", "name_suffix": "```json", "close": "```"}


def test_function_and_argument_markers(derived):
    coder = derived["qwen-qwen3-coder-30b-a3b-instruct"]["tools"]
    assert coder["function"] == {"name_prefix": "<function=", "name_suffix": ">", "close": "</function>"}
    assert coder["argument_markers"] == {"name_prefix": "<parameter=", "name_suffix": ">", "value_prefix": None,
                                         "value_suffix": "</parameter>", "separator": "\n", "start": None, "end": None}
    glm = derived["glm-4.6"]["tools"]["argument_markers"]
    assert (glm["name_prefix"], glm["name_suffix"], glm["value_prefix"], glm["value_suffix"]) == (
        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def test_call_id_position(derived):
    small = derived["mistral-small-3.2-24b-instruct-2506"]["tools"]
    assert small["call_id"] == {"position": "between-func-and-args", "prefix": "[CALL_ID]", "suffix": "[ARGS]"}
    assert derived["mistralai-mistral-nemo-instruct-2407"]["tools"]["call_id"]["position"] == "json-field"
    assert derived["qwen-qwen2.5-7b-instruct"]["tools"]["call_id"]["position"] == "none"


def test_json_field_names(derived):
    nemo = derived["mistralai-mistral-nemo-instruct-2407"]["tools"]["json"]
    assert (nemo["name_field"], nemo["arguments_field"], nemo["id_field"], nemo["array_wrapped"]) == (
        "name", "arguments", "id", True)
    assert derived["meta-llama-llama-3.1-8b-instruct"]["tools"]["json"]["arguments_field"] == "parameters"
    command = derived["cohereforai-c4ai-command-r7b-12-2024-tool_use"]["tools"]["json"]
    assert (command["name_field"], command["arguments_field"]) == ("tool_name", "parameters")
    apertus = derived["apertus-8b-instruct"]["tools"]["json"]
    assert (apertus["name_is_key"], apertus["array_wrapped"], apertus["name_field"]) == (True, True, None)


def test_preserved_tokens_are_the_markers_found(derived):
    assert derived["qwen-qwen3-0.6b"]["preserved_tokens"] == ["<think>", "</think>", "<tool_call>", "</tool_call>"]
    assert derived["google-gemma-2-2b-it"]["preserved_tokens"] == []


def test_a_call_shown_only_in_the_tool_list_is_dropped(derived):
    """Granite 3.3 renders the tool definitions but not the assistant's tool call: the name in the output
    comes from the tool list, so the call is `dropped`, with no format."""
    tools = derived["ibm-granite-granite-3.3-2b-instruct"]["tools"]
    assert (tools["calls"], tools["format"], tools["markers"]) == ("dropped", None, "none")
