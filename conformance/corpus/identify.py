"""Identify the chat templates embedded in GGUF files: corpus match by sha256, family, runner results.

Reads only the GGUF header (runners.gguf_header), never the tensors, so multi-GB models are instant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from conformance.corpus.manifest import Corpus, CorpusError, sha256_text
from runners.gguf_header import read_header

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


def runner_results(report) -> dict:
    """template id -> runner -> {cells, judged, passed, conformance} from a report (conformance.report.Report):
    its passing cells ("passed" per runner) and its cell records (every cell that is not a pass)."""
    from conformance.judge.status import count_statuses, figure

    if report is None:
        return {}
    statuses: dict = {}
    for name, section in report["runners"].items():
        for template, case_ids in section.get("passed", {}).items():
            statuses.setdefault(template, {}).setdefault(name, []).extend(["match"] * len(case_ids))
    for record in report.cells:
        statuses.setdefault(record["template"], {}).setdefault(record["runner"], []).append(record["status"])
    table: dict = {}
    for template, per_runner in statuses.items():
        for name, found in per_runner.items():
            fig = figure(count_statuses({"status": s} for s in found))
            table.setdefault(template, {})[name] = {k: fig[k] for k in ("cells", "judged", "passed", "conformance")}
    return table


def load_report(path: Optional[Path]) -> tuple:
    """(report or None, note). A missing default report is normal; an unreadable explicit one is an error."""
    from conformance.report import load_report as read_report

    explicit = path is not None
    path = Path(path) if explicit else DEFAULT_REPORT
    if not path.exists():
        if explicit:
            raise ValueError(f"{path}: report file not found")
        return None, f"no runner results: {path} does not exist (a conformance run writes it)"
    return read_report(path), f"runner results from {path}"


def identify_gguf(path: Path, corpus: Corpus, results: Optional[dict] = None) -> list[Finding]:
    path = Path(path)
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory; give GGUF files (e.g. {path}/*.gguf)")
    try:
        header = read_header(path)
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
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
                shown = "n/a" if slot["conformance"] is None else f"{slot['conformance']}%"
                ran = f" of {slot['judged']} run" if slot["judged"] != slot["cells"] else ""
                lines.append(f"    {runner}: {slot['passed']}/{slot['cells']} cells pass{ran} ({shown})")
        else:
            lines.append(f"    ({report_note})" if "no runner results" in report_note
                         else "    no runner results for this template in the report")
    return "\n".join(lines)
