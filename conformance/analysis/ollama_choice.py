"""What Ollama does with a GGUF's chat template, for `chatgold identify`: its choice (runners/ollama/selection.py,
from the header alone) and, with --probe, its first case that differs from the reference."""
from __future__ import annotations

from typing import Optional


def choice_for(text: str, architecture: Optional[str]) -> dict:
    """The route, Go template and distance Ollama v0.33.2 picks for this template and architecture."""
    from runners.ollama import selection

    choice = selection.choose(text, architecture)
    return {**choice.facts(), "architecture": architecture, "reason": choice.reason}


def probe(text: str, bos_token: Optional[str], eos_token: Optional[str], template_id: str) -> dict:
    """Every case rendered by the reference and by the ollama runner on this template: the counts, and the
    first case (in case order) the ollama runner does not pass, with its status and the engine's answer."""
    from conformance.corpus.cases import load_cases
    from conformance.judge.classify import classify
    from conformance.judge.goldens import Golden, golden_bytes
    from conformance.judge.status import NOT_JUDGED
    from runners import get_runner
    from runners.hf import HFRunner

    cases = load_cases()
    requests = [case.request(text, bos_token, eos_token, template_id) for case in cases]
    with HFRunner() as reference:
        expected = list(reference.render_many(requests))
    with get_runner("ollama", workers=1) as runner:
        outcomes = list(runner.render_many(requests))
    counts = {"cases": len(cases), "passed": 0, "not judged": 0, "failed": 0}
    first = None
    for case, want, got in zip(cases, expected, outcomes):
        golden = Golden(*golden_bytes(want)) if want.kind in ("rendered", "raised") else None
        result = classify(golden, got)  # the reference's render of this cell stands in for its golden
        if result.status in NOT_JUDGED:
            counts["not judged"] += 1
        elif result.status.passed:
            counts["passed"] += 1
        else:
            counts["failed"] += 1
            if first is None:
                first = {"case": case.id, "status": str(result.status),
                         "engine": (got.text[:300] if got.kind == "rendered" else getattr(got, "message", ""))[:300],
                         "reference": (want.text if want.kind == "rendered" else getattr(want, "message", ""))[:300]}
                if result.divergence is not None:
                    first["offset"] = result.divergence.offset
    return {"counts": counts, "first_difference": first}


def describe_lines(ollama: dict) -> list:
    """Lines for identify's text output."""
    route, template, distance = ollama["ollama.route"], ollama["ollama.template"], ollama["ollama.distance"]
    if route == "go-template":
        line = f"Ollama 0.33.2: uses its Go template {template} (index distance {distance}) instead of this Jinja"
    elif route == "gguf-preferred":
        line = (f"Ollama 0.33.2: detects {template} (index distance {distance}) but keeps this Jinja "
                "(more capabilities than the Go template): llama.cpp renders it")
    elif route == "renderer":
        line = f"Ollama 0.33.2: {ollama['reason']}; the template is not read"
    else:
        line = "Ollama 0.33.2: no index entry within distance 100: llama.cpp renders this Jinja"
    lines = [line]
    found = ollama.get("probe")
    if found:
        c = found["counts"]
        text = (f"Ollama probe: {c['passed']} of {c['cases'] - c['not judged']} judged cases as the reference "
                f"({c['not judged']} not judged)")
        first = found["first_difference"]
        if first:
            where = f" at byte {first['offset']}" if "offset" in first else ""
            text += f"; first differing case {first['case']}: {first['status']}{where}"
        lines.append(text)
    return lines
