"""Identify the chat templates embedded in GGUF files: corpus match by sha256, family, runner results, and
what llama.cpp does with the file: its built-in (non-Jinja) format for the template, and whether the BOS
reaches the model doubled or missing given the file's own special tokens and add-bos/add-eos flags.

Reads only the GGUF header (runners.gguf_header), never the tensors, so multi-GB models are instant. The BOS
answer comes from a report's token verdicts when they were computed with this file's flags; `probe_bos` (the
CLI's --probe) asks the real llama-server and transformers directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from conformance.corpus.manifest import Corpus, CorpusError, sha256_text
from conformance.files import ENCODING_ERRORS
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
    builtin: dict = field(default_factory=dict)  # llama.cpp without --jinja: detected format, report verdict
    tokens: dict = field(default_factory=dict)   # the file's flags; per llama.cpp runner: the BOS verdict
    ollama: dict = field(default_factory=dict)   # Ollama's choice (conformance/analysis/ollama_choice.py)

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


BUILTIN_RUNNER = "llamacpp-builtin"
TOKEN_RUNNERS = ("llamacpp", "llamacpp-builtin")


def template_views(report) -> dict:
    """template id -> runner -> {"basic": verdict, "bos": {bos verdict: cells}, "flags": {...}} from a report."""
    if report is None:
        return {}
    table: dict = {}
    for name, section in report["runners"].items():
        for template, verdict in (section.get("basic") or {}).get("templates", {}).items():
            table.setdefault(template, {}).setdefault(name, {})["basic"] = verdict
        tokens = section.get("tokens") or {}
        for template, row in tokens.get("bos_by_template", {}).items():
            table.setdefault(template, {}).setdefault(name, {})["bos"] = row
        for template, flags in tokens.get("flags", {}).items():
            table.setdefault(template, {}).setdefault(name, {})["flags"] = flags
    return table


def file_flags(header) -> dict:
    """The file's BOS/EOS and the add-bos/add-eos llama.cpp applies to it (stated, or its default)."""
    from runners.llamacpp.model import llama_vocab_flags

    model, pre = header.get("tokenizer.ggml.model"), header.get("tokenizer.ggml.pre")
    stated_bos, stated_eos = header.get("tokenizer.ggml.add_bos_token"), header.get("tokenizer.ggml.add_eos_token")
    add_bos, add_eos, how = llama_vocab_flags(model, pre, stated_bos, stated_eos)
    return {"add_bos_token": add_bos, "add_eos_token": add_eos, "how": how}


def bos_from_report(views: dict, flags: dict) -> dict:
    """runner -> what the report says about the BOS, when it judged the template with this file's add_bos."""
    out = {}
    for runner in TOKEN_RUNNERS:
        view = views.get(runner) or {}
        judged = view.get("flags")
        if not view.get("bos") or judged is None:
            continue
        if judged["add_bos_token"] != flags["add_bos_token"]:
            out[runner] = {"source": "report", "note": f"the report judged add_bos_token={judged['add_bos_token']}, "
                                                       f"this file has {flags['add_bos_token']}: use --probe"}
            continue
        out[runner] = {"source": "report", "cells": dict(view["bos"])}
    return out


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


def identify_gguf(path: Path, corpus: Corpus, results: Optional[dict] = None,
                  views: Optional[dict] = None) -> list[Finding]:
    """results: runner_results(report); views: template_views(report)."""
    from conformance.analysis.ollama_choice import choice_for
    from runners.llamacpp.builtin import detect

    path = Path(path)
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory; give GGUF files (e.g. {path}/*.gguf)")
    try:
        header = read_header(path)
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
    bos, _ = header.special_token("bos")
    eos, _ = header.special_token("eos")
    flags = file_flags(header)
    findings = []
    for name, text in header.chat_templates().items():
        data = text.encode("utf-8", ENCODING_ERRORS)
        sha = sha256_text(data)
        entry = corpus.by_sha.get(sha)
        finding = Finding(gguf=str(path), name=name, key=header.template_key(name), sha256=sha, size=len(data),
                          bos_token=bos, eos_token=eos)
        finding.builtin = detect(text).to_dict()
        finding.ollama = choice_for(text, header.get("general.architecture"))
        finding.tokens = {"flags": flags, "runners": {}}
        if entry is not None:
            finding.corpus_id, finding.family = entry.id, entry.family
            finding.runners = (results or {}).get(entry.id, {})
            template_view = (views or {}).get(entry.id, {})
            if BUILTIN_RUNNER in template_view and "basic" in template_view[BUILTIN_RUNNER]:
                finding.builtin["basic"] = template_view[BUILTIN_RUNNER]["basic"]
            finding.tokens["runners"] = bos_from_report(template_view, flags)
        findings.append(finding)
    return findings


def probe_bos(finding: Finding, text: str, case_id: str = "chat-multi-turn") -> dict:
    """runner -> the BOS verdict of one basic conversation rendered by the real llama-server (with and without
    --jinja) on a tiny GGUF carrying this file's template, BOS/EOS texts and flags, against transformers'
    apply_chat_template(tokenize=True) of the same conversation."""
    from conformance.corpus.cases import load_cases
    from conformance.judge.tokens import compare
    from runners import get_runner
    from runners.base import FeedRequest, Rendered
    from runners.hf import HFRunner, reference_feed
    from runners.vocab import template_markers

    (case,) = [c for c in load_cases() if c.id == case_id]
    request = case.request(text, finding.bos_token, finding.eos_token, finding.corpus_id or "<gguf>")
    flags = finding.tokens["flags"]
    markers = template_markers(text, finding.bos_token, finding.eos_token)
    with HFRunner() as reference:
        rendered = reference.render(request)
    if not isinstance(rendered, Rendered):
        return {runner: {"source": "probe", "note": f"the reference does not render {case_id}: {rendered.message[:200]}"}
                for runner in TOKEN_RUNNERS}
    expected = reference_feed(rendered.text, finding.bos_token, finding.eos_token, markers, flags["add_bos_token"],
                              flags["add_eos_token"])
    out = {}
    for name in TOKEN_RUNNERS:
        with get_runner(name, workers=1) as runner:
            (fed,) = runner.feeds_model_many([FeedRequest(request, flags["add_bos_token"], flags["add_eos_token"],
                                                          markers)])
        if getattr(fed, "kind", "") != "fed":
            out[name] = {"source": "probe", "note": f"llama-server does not render {case_id}: "
                                                    f"{getattr(fed, 'message', '')[:200]}"}
            continue
        verdict = compare(expected, fed.tokens, finding.bos_token, finding.eos_token)
        out[name] = {"source": "probe", "case": case_id, "bos": verdict["bos"],
                     "leading_bos": {"reference": verdict["reference"]["leading_bos"],
                                     "engine": verdict["engine"]["leading_bos"]}}
    return out


def _describe_builtin(builtin: dict) -> str:
    if builtin.get("builtin_format") is None:
        return ("llama.cpp without --jinja: refuses this template (no built-in format recognises it: every request "
                "fails with \"this custom template is not supported, try using --jinja\")")
    text = f"llama.cpp without --jinja: built-in format {builtin['builtin_format']} ({builtin['rule']})"
    basic = builtin.get("basic")
    if basic is not None:
        text += {"right": "; renders the basic conversations like the reference",
                 "wrong": "; renders the basic conversations differently from the reference, without an error",
                 "refused": "; refuses the basic conversations",
                 "not run": "; the report did not run its basic conversations"}[basic]
    return text


def _describe_bos(runner: str, answer: dict) -> str:
    if "note" in answer:
        return f"{runner}: {answer['note']}"
    if answer["source"] == "probe":
        counts = answer["leading_bos"]
        verdict = {"match": "as with transformers"}.get(answer["bos"], answer["bos"])
        return (f"{runner}: {counts['engine']} BOS at the start of what reaches the model, transformers "
                f"{counts['reference']}: {verdict} (probe: {answer['case']})")
    cells = answer["cells"]
    bad = {k: v for k, v in cells.items() if k != "match"}
    total = sum(cells.values())
    if not bad:
        return f"{runner}: the BOS reaches the model as with transformers in all {total} judged cells (report)"
    return f"{runner}: " + ", ".join(f"{k} in {v} of {total} cells" for k, v in sorted(bad.items())) + " (report)"


def describe(path: Path, findings: list[Finding], report_note: str) -> str:
    lines = [f"{path}:"]
    if not findings:
        lines.append("  no chat template in the header (tokenizer.chat_template absent): engines fall back to "
                     "their own default")
    for f in findings:
        lines.append(f"  {f.key}  sha256:{f.sha256[:16]}  {f.size} bytes  bos={f.bos_token!r} eos={f.eos_token!r}")
        if f.builtin:
            lines.append("    " + _describe_builtin(f.builtin))
        if f.ollama:
            from conformance.analysis.ollama_choice import describe_lines

            lines.extend("    " + line for line in describe_lines(f.ollama))
        if f.tokens:
            flags = f.tokens["flags"]
            lines.append(f"    tokens: add_bos_token={str(flags['add_bos_token']).lower()} "
                         f"add_eos_token={str(flags['add_eos_token']).lower()} ({flags['how']})")
            for runner, answer in sorted(f.tokens.get("runners", {}).items()):
                lines.append("    BOS " + _describe_bos(runner, answer))
            if not f.tokens.get("runners"):
                lines.append("    BOS: no token verdict for this template and these flags in the report "
                             "(`chatgold identify --probe` asks llama-server)")
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
