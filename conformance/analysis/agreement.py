"""Capability agreement: an engine's own view of each template's capabilities against our capability goldens.

Any runner whose `reports_capabilities()` is true takes part (today llama.cpp, whose llama-server reports
`chat_template_caps` in /props). The generation prompt is compared through the engine's own renders of the
capability probes (its own G1 differential), which any runner can do.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.analysis.capabilities import (
    generation_prompt,
    load_capabilities,
    probe_requests,
)
from runners.base import Errored, Skipped

FORMAT = 1
COUNTS = ("agree", "disagree", "unknown")
MAX_DISAGREEMENTS = 20  # examples kept per capability

# Engine capability key (llama.cpp's chat_template_caps names) -> the same answer read from our record.
ENGINE_CAPS: dict[str, Callable[[dict], Optional[bool]]] = {
    # llama.cpp counts a system message as supported when its content is used at all (folded included).
    "supports_system_role": lambda c: c["system_role"] in ("own-turn", "folded"),
    "supports_tools": lambda c: c["tools"]["definitions"] == "rendered",
    "supports_tool_calls": lambda c: c["tools"]["calls"] == "rendered",
    "supports_parallel_tool_calls": lambda c: c["tools"]["parallel"] == "both",
    "supports_object_arguments": lambda c: c["tools"]["arguments"]["object"],
    "supports_preserve_reasoning": lambda c: c["reasoning"]["past_turns"] == "kept",
}


# llama.cpp's autoparser fields (its log names, runners/llamacpp/analysis.py) -> the same answer in our record.
# Markers compare trimmed, an empty marker as null; enums through the tables below.
_MODES = {"reasoning_mode": {"NONE": "none", "TAG_BASED": "tag-based", "TOOLS_ONLY": "tools-only"},
          "content_mode": {"PLAIN": "plain", "ALWAYS_WRAPPED": "always-wrapped",
                           "WRAPPED_WITH_REASONING": "conditional"},
          "tool_mode": {"NONE": None, "JSON_NATIVE": "json-native", "TAG_WITH_JSON": "tag-json",
                        "TAG_WITH_TAGGED": "tag-tagged"},
          "call_id_pos": {"NONE": "none", "PRE_FUNC_NAME": "pre-func-name",
                          "BETWEEN_FUNC_AND_ARGS": "between-func-and-args", "POST_ARGS": "post-args"}}


def _tools(c: dict) -> dict:
    return c["tools"]


def _json_field(name: str) -> Callable[[dict], Optional[str]]:
    return lambda c: (_tools(c).get("json") or {}).get(name)


ANALYSIS_FIELDS: dict[str, Callable[[dict], object]] = {
    "user_msg_start": lambda c: c["turns"]["user_start"],
    "assistant_msg_start": lambda c: c["turns"]["assistant_start"],
    "reasoning_mode": lambda c: c["reasoning"]["mode"],
    "reasoning_start": lambda c: c["reasoning"]["start"],
    "reasoning_end": lambda c: c["reasoning"]["end"],
    "content_mode": lambda c: c["content"]["mode"],
    "content_start": lambda c: c["content"]["start"],
    "content_end": lambda c: c["content"]["end"],
    "tool_mode": lambda c: _tools(c)["format"],
    "tool_section_start": lambda c: _tools(c)["section_start"],
    "tool_section_end": lambda c: _tools(c)["section_end"],
    "per_call_start": lambda c: _tools(c)["per_call_start"],
    "per_call_end": lambda c: _tools(c)["per_call_end"],
    "func_name_prefix": lambda c: _tools(c)["function"]["name_prefix"],
    "func_name_suffix": lambda c: _tools(c)["function"]["name_suffix"],
    "func_close": lambda c: _tools(c)["function"]["close"],
    "call_id_pos": lambda c: {"json-field": "none"}.get(_tools(c)["call_id"]["position"],
                                                       _tools(c)["call_id"]["position"]),
    "call_id_prefix": lambda c: _tools(c)["call_id"]["prefix"],
    "call_id_suffix": lambda c: _tools(c)["call_id"]["suffix"],
    "args_start": lambda c: _tools(c)["argument_markers"]["start"],
    "args_end": lambda c: _tools(c)["argument_markers"]["end"],
    "arg_name_prefix": lambda c: _tools(c)["argument_markers"]["name_prefix"],
    "arg_name_suffix": lambda c: _tools(c)["argument_markers"]["name_suffix"],
    "arg_value_prefix": lambda c: _tools(c)["argument_markers"]["value_prefix"],
    "arg_value_suffix": lambda c: _tools(c)["argument_markers"]["value_suffix"],
    # JSON field names mean something only for JSON-native calls (llama.cpp logs its defaults otherwise)
    "name_field": _json_field("name_field"),
    "args_field": _json_field("arguments_field"),
    "id_field": _json_field("id_field"),
    "parameter_order": lambda c: ", ".join(_json_field("parameter_order")(c) or []) or None,
}
JSON_ONLY = ("name_field", "args_field", "id_field", "parameter_order")
_TOOL_PROBES = ("call_object",)
# The probes each field is read from: when they all raised (a template that refuses an assistant message
# whose eos_token is unknown), our record has no answer for that field: unknown, not a disagreement.
NEEDS: dict[str, tuple] = {
    "user_msg_start": ("user_assistant_user",), "assistant_msg_start": ("user_assistant",),
    "reasoning_mode": ("reasoning_content_tools", "reasoning_call", "reasoning_last", "thinking_on_gp"),
    "reasoning_start": ("reasoning_last", "thinking_on_gp", "think_in_content_past"),
    "reasoning_end": ("reasoning_last", "thinking_on_gp", "think_in_content_past"),
    "content_mode": ("content_tools",), "content_start": ("content_tools",), "content_end": ("content_tools",),
}
# Fields of our record llama.cpp b11434 has too but never logs: listed as rows, every template unknown.
NOT_LOGGED_FIELDS = {"arguments_separator": "tools.argument_markers.separator",
                     "function_field": "tools.json.function_field", "fun_name_is_key": "tools.json.name_is_key",
                     "tools_array_wrapped": "tools.json.array_wrapped", "preserved_tokens": "preserved_tokens"}
ANALYSIS_PREFIX = "autoparser."


def engine_field(name: str, value: Optional[str]):
    """An engine's logged value in our vocabulary: enums mapped, markers trimmed, empty as null."""
    if value is None:
        return None
    if name in _MODES:
        return _MODES[name].get(value.strip(), value.strip())
    return value.strip() or None


def our_field(name: str, caps: dict):
    value = ANALYSIS_FIELDS[name](caps)
    return value.strip() or None if isinstance(value, str) else value


def analysis_agreement(templates: list, runner, golden: dict, tally: Callable) -> dict:
    """Per autoparser field: our record against the engine's own analysis of the same template. Returns notes:
    how many templates the engine analysed, handled with a specialized parser, or could not load."""
    notes = {"analysed": 0, "specialized": 0, "unavailable": 0, "not_logged": []}
    for entry in templates:
        caps = golden[entry.id]
        found = runner.template_analysis(entry.source(), entry.bos_token, entry.eos_token)
        fields = (found or {}).get("fields")
        if found is None:
            notes["unavailable"] += 1
        elif fields is None:
            notes["specialized" if found.get("specialized") else "unavailable"] += 1
        else:
            notes["analysed"] += 1
            notes["not_logged"] = found.get("not_logged", [])
        for name in ANALYSIS_FIELDS:
            ours = our_field(name, caps) if caps else None
            theirs = engine_field(name, fields.get(name)) if fields else None
            # JSON field names: not applicable (unknown) without a JSON call object to name fields of
            applicable = caps is not None and (name not in JSON_ONLY or caps["tools"]["format"] == "json-native") \
                and not set(NEEDS.get(name, _TOOL_PROBES)) <= set(caps.get("probes_raised", []))
            tally(ANALYSIS_PREFIX + name, entry.id, ours, theirs, known=fields is not None and applicable)
        for name in NOT_LOGGED_FIELDS:
            tally(ANALYSIS_PREFIX + name, entry.id, None, None, known=False)
    return notes


def engine_agreement(templates: Iterable, runner, root: Optional[Path] = None) -> dict:
    """Per capability: on how many templates the engine and our goldens agree/disagree, with examples."""
    templates = list(templates)
    counts: dict = {}

    def tally(capability: str, template_id: str, ours, theirs, known: Optional[bool] = None) -> None:
        """known: both sides gave an answer (for fields where null is an answer: no marker)."""
        row = counts.setdefault(capability, {"agree": 0, "disagree": 0, "unknown": 0, "disagreements": []})
        if (ours is None or theirs is None) if known is None else not known:
            row["unknown"] += 1
        elif ours == theirs:
            row["agree"] += 1
        else:
            row["disagree"] += 1
            if len(row["disagreements"]) < MAX_DISAGREEMENTS:
                row["disagreements"].append({"template": template_id, "reference": ours, runner.name: theirs})

    golden = {t.id: load_capabilities(t.id, root) for t in templates}
    gp_requests = []
    for entry in templates:
        gp_requests.extend(r for r in probe_requests(entry.source(), entry.bos_token, entry.eos_token, entry.id)
                           if r.case_id in ("capabilities:user", "capabilities:user_gp"))
    gp_outcomes = list(runner.render_many(gp_requests))
    notes = None
    if runner.reports_template_analysis():
        # first: llama.cpp answers /props from the same server start, so template_capabilities costs nothing more
        notes = analysis_agreement(templates, runner, golden, tally)
    for index, entry in enumerate(templates):
        caps = golden[entry.id]
        without, with_ = gp_outcomes[2 * index], gp_outcomes[2 * index + 1]
        theirs_gp = None
        if not isinstance(without, (Errored, Skipped)) and not isinstance(with_, (Errored, Skipped)):
            theirs_gp = generation_prompt(without, with_)["text"]
        tally("generation_prompt", entry.id, caps["generation_prompt"]["text"] if caps else None, theirs_gp)
        theirs_caps = runner.template_capabilities(entry.source(), entry.bos_token, entry.eos_token)
        for key, read in ENGINE_CAPS.items():
            ours = read(caps) if caps else None
            theirs = theirs_caps.get(key) if isinstance(theirs_caps, dict) else None
            tally(key, entry.id, ours, theirs)
    if notes is not None:
        counts[NOTES] = notes
    return counts


NOTES = "<autoparser notes>"


def summarize_agreement(counts: dict, engine: Optional[dict] = None) -> dict:
    """The report's section from per-capability counts: each row with its compared count and agreement rate.
    Rows named `autoparser.<field>` compare the engine's own output-parser analysis field by field; the
    section's `autoparser` says over how many templates and which fields the engine never reports."""
    counts = dict(counts)
    notes = counts.pop(NOTES, None)
    capabilities = {}
    for name, row in sorted(counts.items()):
        compared = row["agree"] + row["disagree"]
        capabilities[name] = {**row, "compared": compared,
                              "agreement": round(row["agree"] / compared, 4) if compared else None}
    section = {"format": FORMAT, "engine": engine or {}, "capabilities": capabilities}
    if notes is not None:
        section["autoparser"] = notes
    return section


def agreement_section(templates: Iterable, runner) -> dict:
    """The report's `capability_agreement` section for these templates, computed with an open runner."""
    templates = list(templates)
    section = summarize_agreement(engine_agreement(templates, runner), runner.describe())
    section["templates"] = len(templates)
    return section


def load_agreement(path) -> dict:
    """A section written by `chatgold capabilities compare --out PATH`, checked enough to render."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable capability agreement JSON: {exc}") from None
    what = "a capability agreement summary (from `chatgold capabilities compare --out`)"
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("capabilities"), dict):
        raise ValueError(f"{path}: not {what}: expected an object with format {FORMAT} and `capabilities`")
    for name, row in data["capabilities"].items():
        if not isinstance(row, dict) or not all(isinstance(row.get(k), int) and row[k] >= 0 for k in COUNTS):
            raise ValueError(f"{path}: capability {name!r}: expected non-negative integer "
                             f"{'/'.join(COUNTS)} counts")
        if not isinstance(row.get("disagreements", []), list):
            raise ValueError(f"{path}: capability {name!r}: `disagreements` must be a list")
    data.setdefault("engine", {})
    data["source"] = str(path)
    return data
