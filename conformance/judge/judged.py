"""Judged results kept between runs: a warm run takes each template's judged cells as they were, instead of
reading every outcome from the result store and judging it against its golden again.

A cell's judged result is a function of the runner's identity, the request (the template's bytes, the
conversation, the special tokens), the golden's bytes and the judging code, as an outcome is of the first two
(render/store.py). So, per runner identity and template, the store keeps a judged file: a digest of all of that
for the template's selected cells, and each cell's result in a compact form. A template whose digest still holds
is taken as it is; the others are rendered (through the result store, as before) and judged, and their files
written again. Nothing is kept of a template with a cell the store would not keep either (errored, timed out),
so a failure is asked again next time. Later stages (tokens, explain, verdicts) run on the results as on
freshly judged ones. A file that does not read back as written (truncated, another format) is judged afresh.
"""
from __future__ import annotations

import hashlib
import marshal
import zlib
from dataclasses import MISSING, fields
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

from conformance.judge.classify import MATCHED, Judgement
from conformance.judge.diff import Divergence
from conformance.judge.status import CellResult, Status
from runners.base import Errored, Raised, RefusalKind, Rendered, Skipped

FORMAT = 1
# Fields of a judged CellResult kept for a cell that is not a plain match (later stages' fields are theirs).
FIELDS = ("divergence", "message", "detail", "output", "golden_kind", "refusal", "reference_refusal",
          "reference_message", "note", "fingerprint", "golden_window", "output_window")
_EMPTY = {"message": "", "detail": ""}  # the other fields default to None
_REFUSALS = {str(kind): kind for kind in RefusalKind}
_STATUSES = {str(status): status for status in Status}  # Status(text) costs an enum lookup a cell


@lru_cache(maxsize=1)
def judge_code() -> str:
    """A digest of the code that decides a judged result: a change to any of it judges every cell again."""
    here = Path(__file__).resolve().parent
    files = [here / name for name in ("classify.py", "diff.py", "goldens.py", "status.py", "pipeline.py",
                                      "judged.py")]
    files.append(here.parent.parent / "runners" / "base.py")
    digest = hashlib.sha256(b"judged %d\n" % FORMAT)
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def judged_key(template_key: str, template_id: str) -> str:
    """A judged file's name in the store: one per template id (two ids may share a template's bytes) and judging
    code (two checkouts sharing a store keep a file each instead of judging again in turn)."""
    return hashlib.sha256(f"{judge_code()} {template_key} {template_id}".encode()).hexdigest()


def section_digest(template_key: str, case_keys: Sequence[str], goldens: Sequence) -> str:
    """What a template's judged cells depend on beside the runner: its bytes, each cell's request and golden."""
    digest = hashlib.sha256(f"{judge_code()} {template_key}\n".encode())
    for case, golden in zip(case_keys, goldens):
        if golden is None:
            digest.update(f"{case} none\n".encode())
        else:
            digest.update(f"{case} {golden.kind} {len(golden.data)}\n".encode())
            digest.update(golden.data)
    return digest.hexdigest()


def _outcome_record(outcome) -> list:
    if type(outcome) is Rendered:
        return ["rendered", outcome.text]
    if type(outcome) is Raised:
        return ["raised", outcome.message, str(outcome.refusal)]
    return ["skipped", outcome.message]


def _outcome(record: list):
    kind = record[0]
    if kind == "rendered":
        return Rendered(record[1])
    if kind == "raised":
        return Raised(record[1], _REFUSALS[record[2]])
    if kind == "skipped":
        return Skipped(record[1])
    raise ValueError(f"unknown outcome record {kind!r}")


def encode_section(digest: str, results: Sequence[CellResult]) -> Optional[bytes]:
    """A judged file's bytes, or None when a cell must be asked again next time (errored, timed out)."""
    records = []
    for result in results:
        outcome = result.outcome
        if outcome is None or isinstance(outcome, Errored):
            return None
        if result.status is Status.MATCH and type(outcome) is Rendered and result.golden_kind == "rendered":
            records.append(None)  # a plain match: the outcome is the golden's text
            continue
        values = {}
        for name in FIELDS:
            value, default = getattr(result, name), _EMPTY.get(name)
            if type(value) is not type(default) or value != default:  # "" is kept where None is the default
                values[name] = value.to_dict() if name == "divergence" else value
        if values.get("output") is not None and type(outcome) is Rendered and values["output"] == outcome.text:
            values["output"] = True  # the outcome's text, not kept twice
        records.append((str(result.status), _outcome_record(outcome), values))
    return zlib.compress(marshal.dumps((FORMAT, digest, records)), 1)


def decode_section(data: bytes, digest: str, runner: str, template_id: str, case_ids: Sequence[str],
                   goldens: Sequence) -> Optional[list]:
    """The template's judged results, or None when the file is not one for this digest (or does not read)."""
    try:
        stored_format, stored_digest, records = marshal.loads(zlib.decompress(data))
        if stored_format != FORMAT or stored_digest != digest or len(records) != len(case_ids):
            return None
        return [_result(record, runner, template_id, case_id, golden)
                for record, case_id, golden in zip(records, case_ids, goldens)]
    except (ValueError, TypeError, KeyError, IndexError, EOFError, zlib.error):
        return None


# Every field of a CellResult at its default (each an immutable value): a kept result is this with its own values
# over it, the instance dictionary the dataclass's __init__ would make, at a third of its cost (a warm full gate
# makes 1.3 million of them).
_BLANK = {f.name: None if f.default is MISSING else f.default for f in fields(CellResult)}  # in field order


def _made(values: dict) -> CellResult:
    result = object.__new__(CellResult)
    result.__dict__.update(_BLANK)
    result.__dict__.update(values)
    return result


def _result(record, runner: str, template_id: str, case_id: str, golden) -> CellResult:
    if record is None:
        return _made({"runner": runner, "template_id": template_id, "case_id": case_id, "status": Status.MATCH,
                      "golden_kind": "rendered", "outcome": golden.as_rendered(), "judgement": MATCHED})
    status_text, outcome_record, values = record
    status = _STATUSES[status_text]
    outcome = _outcome(outcome_record)
    values = dict(values)
    divergence = values.pop("divergence", None)
    if divergence is not None:
        divergence = Divergence(**divergence)
    if values.get("output") is True:
        values["output"] = outcome.text
    return _made({"runner": runner, "template_id": template_id, "case_id": case_id, "status": status,
                  "divergence": divergence, "outcome": outcome,
                  "judgement": Judgement(status, divergence, values.get("note") or ""), **values})
