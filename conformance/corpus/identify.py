"""Identify the chat templates embedded in GGUF files: corpus match by sha256, family, runner results.

Reads only the GGUF header (runners.gguf_header), never the tensors, so multi-GB models are instant.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from runners.gguf_header import read_header

from conformance.judge.status import PASSING
from conformance.corpus.manifest import Corpus, sha256_text

DEFAULT_REPORT = Path("reports") / "report.json"  # what `tox -e conformance` writes


@dataclass
class Finding:
    gguf: str
    name: str            # "default" or the named template's name
    key: str             # the GGUF key it came from
    sha256: str
    size: int
    bos_token: Optional[str]
    eos_token: Optional[str]
    corpus_id: Optional[str] = None
    family: Optional[str] = None
    runners: dict = field(default_factory=dict)  # runner -> {"cells", "passed", "conformance"}

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def runner_results(report: Optional[dict]) -> dict:
    """template id -> runner -> {cells, passed, conformance} from a JSON report's per-cell results.

    Reads the JSON report (schemas/report.schema.json): per runner under "runners", the listed "cells"
    (records with "template" and "status") plus "passed" ({template: [case ids]} of cells left out of "cells"
    because they pass as expected) and "known" ({template: {case id: "status[:fingerprint]"}}, known
    divergences left out of "cells"). Flat cell records ({"runner", "template", "status"}) under a top-level
    "results" or "cells" are read too. Anything else yields {} (no numbers shown)."""
    if not isinstance(report, dict):
        return {}
    records = []
    for key in ("results", "cells"):
        if isinstance(report.get(key), list):
            records.extend(report[key])
    runners = report.get("runners")
    if isinstance(runners, dict):
        for name, body in runners.items():
            if isinstance(body, dict):
                for key in ("results", "cells"):
                    for item in body.get(key) or []:
                        if isinstance(item, dict):
                            records.append({"runner": name, **item})
                passed = body.get("passed")
                if isinstance(passed, dict):
                    for template, case_ids in passed.items():
                        for case_id in case_ids if isinstance(case_ids, list) else []:
                            records.append({"runner": name, "template": template, "case": case_id,
                                            "status": "match"})
                known = body.get("known")  # known divergences past the report's full-record budget
                if isinstance(known, dict):
                    for template, cases in known.items():
                        for case_id, status in cases.items() if isinstance(cases, dict) else ():
                            records.append({"runner": name, "template": template, "case": case_id,
                                            "status": str(status).split(":", 1)[0]})
    table: dict = {}
    for item in records:
        if not isinstance(item, dict) or not {"runner", "template", "status"} <= item.keys():
            continue
        slot = table.setdefault(item["template"], {}).setdefault(item["runner"], {"cells": 0, "passed": 0})
        slot["cells"] += 1
        slot["passed"] += item["status"] in PASSING
    for per_runner in table.values():
        for slot in per_runner.values():
            slot["conformance"] = round(100.0 * slot["passed"] / slot["cells"], 2)
    return table


def load_report(path: Optional[Path]) -> tuple[Optional[dict], str]:
    """(report, note). A missing default report is normal; an unreadable explicit one is an error."""
    explicit = path is not None
    path = Path(path) if explicit else DEFAULT_REPORT
    if not path.exists():
        if explicit:
            raise ValueError(f"{path}: report file not found")
        return None, f"no runner results: {path} does not exist (a conformance run writes it)"
    try:
        return json.loads(path.read_text(encoding="utf-8")), f"runner results from {path}"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON report: {exc}") from None


def identify_gguf(path: Path, corpus: Corpus, results: Optional[dict] = None) -> list[Finding]:
    header = read_header(path)
    bos, _ = header.special_token("bos")
    eos, _ = header.special_token("eos")
    findings = []
    for name, text in header.chat_templates().items():
        data = text.encode("utf-8", "surrogatepass")
        sha = sha256_text(data)
        entry = corpus.by_sha.get(sha)
        finding = Finding(gguf=str(path), name=name, key=header.template_key(name), sha256=sha, size=len(data),
                          bos_token=bos, eos_token=eos)
        if entry is not None:
            finding.corpus_id, finding.family = entry.id, entry.family
            finding.runners = (results or {}).get(entry.id, {})
        findings.append(finding)
    return findings


def describe(path: Path, findings: list[Finding], report_note: str) -> str:
    lines = [f"{path}:"]
    if not findings:
        lines.append("  no chat template in the header (tokenizer.chat_template absent): engines fall back to "
                     "their own default")
    for f in findings:
        lines.append(f"  {f.key}  sha256:{f.sha256[:16]}  {f.size} bytes  bos={f.bos_token!r} eos={f.eos_token!r}")
        if f.corpus_id is None:
            lines.append("    unknown: not in the corpus. Add it with `chatgold corpus import "
                         f"{path}` (then `chatgold goldens update --template <new id>`)")
            continue
        lines.append(f"    corpus: {f.corpus_id}  family: {f.family}")
        if f.runners:
            for runner, slot in sorted(f.runners.items()):
                lines.append(f"    {runner}: {slot['passed']}/{slot['cells']} cells pass ({slot['conformance']}%)")
        else:
            lines.append(f"    ({report_note})" if "no runner results" in report_note
                         else "    no runner results for this template in the report")
    return "\n".join(lines)
