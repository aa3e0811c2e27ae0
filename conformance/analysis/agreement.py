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


def engine_agreement(templates: Iterable, runner, root: Optional[Path] = None) -> dict:
    """Per capability: on how many templates the engine and our goldens agree/disagree, with examples."""
    templates = list(templates)
    counts: dict = {}

    def tally(capability: str, template_id: str, ours, theirs) -> None:
        row = counts.setdefault(capability, {"agree": 0, "disagree": 0, "unknown": 0, "disagreements": []})
        if ours is None or theirs is None:
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
    return counts


def summarize_agreement(counts: dict, engine: Optional[dict] = None) -> dict:
    """The report's section from per-capability counts: each row with its compared count and agreement rate."""
    capabilities = {}
    for name, row in sorted(counts.items()):
        compared = row["agree"] + row["disagree"]
        capabilities[name] = {**row, "compared": compared,
                              "agreement": round(row["agree"] / compared, 4) if compared else None}
    return {"format": FORMAT, "engine": engine or {}, "capabilities": capabilities}


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
