"""Token parity: a second verdict beside bytes, on the token sequence that reaches the model.

Byte-identical text is not what a model sees: engines tokenize the rendered prompt and many add a BOS of their
own, so a template that already prints `{{ bos_token }}` can reach the model with two. For each cell:

- the reference's sequence: what `transformers.apply_chat_template(tokenize=True)` feeds the model, i.e. the
  golden text tokenized with add_special_tokens=False (runners.hf.reference_feed) by a real tokenizer built
  offline with the model's add-bos/add-eos flags, in which bos, eos and the template's markers are one id each;
- the engine's sequence: what the runner says its engine feeds the model (Runner.feeds_model_many; llama.cpp:
  llama-server's own /tokenize of its own prompt, on a GGUF carrying the same flags and markers).

The two are compared as runs of special tokens and text (text is compared as bytes, so two tokenizers that
split plain text differently still agree). Statuses (TokenStatus) never change a cell's byte status.

A verdict needs the model's BOS text and add_bos_token from evidence (templates/manifest.json); without them
the cell is `unknown`. Where only add_eos_token (or the EOS text) is unknown, a BOS difference is still
reported (the end of the sequence cannot change the start), anything else is `unknown`.
"""
from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Iterable, Optional, Sequence

from conformance.files import ENCODING_ERRORS
from runners.base import Fed, FeedRequest, Raised, canonical_json
from runners.vocab import template_markers

WINDOW = 6  # runs of tokens kept either side of the first difference


class TokenStatus(StrEnum):
    MATCH = "token-match"
    DUPLICATED_BOS = "duplicated-bos"   # the engine's sequence starts with more BOS than the reference's (2+)
    ADDED_BOS = "added-bos"             # the engine starts with a BOS where the reference has none
    MISSING_BOS = "missing-bos"         # the engine starts with fewer BOS than the reference
    DUPLICATED_EOS = "duplicated-eos"   # the same at the end of the sequence, for EOS
    ADDED_EOS = "added-eos"
    MISSING_EOS = "missing-eos"
    DIFFERENT = "token-difference"      # any other difference (text, a marker split differently)
    UNKNOWN = "unknown"                 # the model's special tokens or flags are not known
    NOT_COMPARED = "not-compared"       # a side has no sequence: the reference refused, the engine did not render


BOS_STATUSES = frozenset({TokenStatus.DUPLICATED_BOS, TokenStatus.ADDED_BOS, TokenStatus.MISSING_BOS})
EOS_STATUSES = frozenset({TokenStatus.DUPLICATED_EOS, TokenStatus.ADDED_EOS, TokenStatus.MISSING_EOS})
TOKEN_STATUSES = tuple(TokenStatus)


def _known(entry, name: str) -> bool:
    return ((getattr(entry, "tokens_evidence", None) or {}).get(name) or {}).get("status") == "evidence"


def model_tokens(entry) -> tuple[Optional[dict], list]:
    """(the model's token facts, the unknown ones) for a corpus entry: {"bos_token", "eos_token",
    "add_bos_token", "add_eos_token", "markers"}; None when no BOS verdict is possible."""
    unknown = [name for name in ("bos_token", "add_bos_token", "eos_token", "add_eos_token") if not _known(entry, name)]
    if "bos_token" in unknown or "add_bos_token" in unknown:
        return None, unknown
    if entry.add_bos_token and entry.bos_token is None:  # evidence contradicts itself: no verdict on it
        return None, ["bos_token"]
    facts = {"bos_token": entry.bos_token, "eos_token": entry.eos_token, "add_bos_token": bool(entry.add_bos_token),
             "add_eos_token": entry.add_eos_token if "add_eos_token" not in unknown else None}
    facts["markers"] = template_markers(entry.source(), entry.bos_token, entry.eos_token)
    return facts, unknown


def runs(tokens: Iterable) -> list:
    """A token sequence as runs: (True, special token text) per special token, (False, bytes) per text run."""
    out: list = []
    for token in tokens:
        if token.special:
            out.append((True, bytes(token.piece)))
        elif out and not out[-1][0]:
            out[-1] = (False, out[-1][1] + bytes(token.piece))
        else:
            out.append((False, bytes(token.piece)))
    return out


def _leading(items: list, text: Optional[bytes]) -> int:
    count = 0
    while text is not None and count < len(items) and items[count] == (True, text):
        count += 1
    return count


def _trailing(items: list, text: Optional[bytes]) -> int:
    count = 0
    while text is not None and count < len(items) and items[len(items) - 1 - count] == (True, text):
        count += 1
    return count


def _end_status(reference: int, engine: int, kinds: tuple) -> Optional[TokenStatus]:
    duplicated, added, missing = kinds
    if engine > reference:
        return duplicated if engine >= 2 else added
    if engine < reference:
        return missing
    return None


def _show_runs(items: list) -> list:
    return [("special " if special else "") + data.decode("utf-8", "backslashreplace") for special, data in items]


def compare(reference: Sequence, engine: Sequence, bos_token: Optional[str], eos_token: Optional[str]) -> dict:
    """The token verdict of one cell from two token sequences (runners.base.Token)."""
    ref, eng = runs(reference), runs(engine)
    bos = bos_token.encode("utf-8", ENCODING_ERRORS) if bos_token else None
    eos = eos_token.encode("utf-8", ENCODING_ERRORS) if eos_token else None
    counts = {"reference": {"tokens": len(reference), "leading_bos": _leading(ref, bos), "trailing_eos": _trailing(ref, eos)},
              "engine": {"tokens": len(engine), "leading_bos": _leading(eng, bos), "trailing_eos": _trailing(eng, eos)}}
    bos_status = _end_status(counts["reference"]["leading_bos"], counts["engine"]["leading_bos"],
                             (TokenStatus.DUPLICATED_BOS, TokenStatus.ADDED_BOS, TokenStatus.MISSING_BOS))
    eos_status = _end_status(counts["reference"]["trailing_eos"], counts["engine"]["trailing_eos"],
                             (TokenStatus.DUPLICATED_EOS, TokenStatus.ADDED_EOS, TokenStatus.MISSING_EOS))
    first = next((i for i, (a, b) in enumerate(zip(ref, eng)) if a != b), None)
    if first is None and len(ref) != len(eng):
        first = min(len(ref), len(eng))
    status = bos_status or eos_status or (TokenStatus.DIFFERENT if first is not None else TokenStatus.MATCH)
    verdict = {"status": str(status), "bos": str(bos_status) if bos_status else "match", **counts}
    if first is not None:
        start = max(0, first - WINDOW)
        verdict["first_difference"] = first
        verdict["reference_runs"] = _show_runs(ref[start:first + WINDOW])
        verdict["engine_runs"] = _show_runs(eng[start:first + WINDOW])
    return verdict


def verdict_for(entry, facts: Optional[dict], unknown: list, golden, fed) -> dict:
    """The token verdict of one cell: golden (judge.goldens.Golden or None), fed (what the engine fed: Fed,
    or the Outcome that stopped it; None when it was not asked)."""
    if facts is None:
        return {"status": str(TokenStatus.UNKNOWN), "bos": None, "unknown": unknown,
                "note": "the model's " + " and ".join(n for n in unknown if n in ("bos_token", "add_bos_token"))
                        + " not known from evidence"}
    if golden is None or golden.raised:
        why = "no golden" if golden is None else "the reference refused"
        return {"status": str(TokenStatus.NOT_COMPARED), "bos": None, "note": why}
    if not isinstance(fed, Fed):
        kind = getattr(fed, "kind", "not asked")
        note = f"the engine did not render ({kind}: {getattr(fed, 'message', '')[:200]})"
        return {"status": str(TokenStatus.NOT_COMPARED), "bos": None, "note": note,
                **({"refusal": str(fed.refusal)} if isinstance(fed, Raised) else {})}
    from runners.hf import reference_feed

    reference = reference_feed(golden.text, facts["bos_token"], facts["eos_token"], facts["markers"],
                               facts["add_bos_token"], facts["add_eos_token"])
    verdict = compare(reference, fed.tokens, facts["bos_token"], facts["eos_token"])
    verdict["flags"] = {"add_bos_token": facts["add_bos_token"], "add_eos_token": facts["add_eos_token"]}
    end_unknown = [name for name in unknown if name in ("eos_token", "add_eos_token")]
    if end_unknown:
        verdict["unknown"] = end_unknown
        same_text = facts["bos_token"] is not None and facts["bos_token"] == facts["eos_token"]
        if verdict["status"] not in {str(s) for s in BOS_STATUSES} or same_text:
            verdict["status"] = str(TokenStatus.UNKNOWN)
            verdict["note"] = (f"the model's {' and '.join(end_unknown)} not known from evidence: only the start of "
                               f"the sequence is judged")
            if same_text:
                verdict["bos"] = None
    return verdict


def feed_request(cell, facts: dict) -> FeedRequest:
    return FeedRequest(cell.request, facts["add_bos_token"], facts["add_eos_token"], tuple(facts["markers"]))


def token_identity(runner_identity: dict) -> tuple:
    """(digest, identity) a cell's token verdict is stored under (conformance/render/store.py): the engine's
    runner identity (what it feeds its model), the reference tokenizer's (transformers, tokenizers and the
    code building it: runners/hf.py, runners/vocab.py) and this module's, which compares the two."""
    from pathlib import Path

    from conformance.render.store import identity_digest
    from runners.identity import dist_versions, source_digest

    identity = {"name": "token-parity", "runner": runner_identity,
                "tokenizer": {"packages": dist_versions("transformers", "tokenizers"),
                              "code": source_digest("hf.py", "vocab.py")},
                "judge": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    return identity_digest(identity), identity


def _verdict_key(cell, facts: dict, unknown: list, golden) -> str:
    """A cell's token-verdict key: everything besides the identities that decides it (the request, the model's
    token facts, the golden's bytes)."""
    from conformance.render.store import TOKENS_PREFIX, request_key

    key = request_key(cell.request)
    if key is None:
        return ""
    detail = canonical_json({"case": key[1], "facts": facts, "unknown": unknown, "golden": golden.kind,
                             "text": hashlib.sha256(golden.data).hexdigest()})
    return TOKENS_PREFIX + hashlib.sha256(detail.encode("utf-8", ENCODING_ERRORS)).hexdigest()


def _storable(fed) -> bool:
    """A verdict is kept only when the engine answered (tokens, a refusal, a skip): a crash is asked again."""
    from conformance.render.store import cacheable

    return isinstance(fed, Fed) or cacheable(fed)


def token_parity(runner, cells: Sequence, results: Sequence, goldens, store=None, refresh: bool = False) -> None:
    """Give every result a token verdict (`result.tokens`) when the runner can tell what its engine
    feeds the model (Runner.reports_tokens); results and cells are in the same order. With a result store,
    a cell's verdict is read from it when stored under the same runner and tokenizer identities, request,
    token facts and golden (refresh: ask the engine again); only the other cells reach the engine."""
    if not runner.reports_tokens():
        return
    identity = None
    if store is not None:
        runner_identity = store.identity_of(runner)
        identity = token_identity(runner_identity[1]) if runner_identity is not None else None
    facts_of: dict = {}
    asked, plans, packs, keep = [], [], {}, {}
    for cell, result in zip(cells, results):
        entry = cell.template
        if entry.id not in facts_of:
            facts_of[entry.id] = model_tokens(entry)
        facts, unknown = facts_of[entry.id]
        golden = goldens(entry.id, cell.case.id)
        ask = facts is not None and golden is not None and not golden.raised
        if ask and identity is not None:
            from conformance.render.store import template_key

            key = _verdict_key(cell, facts, unknown, golden)
            if key:
                template = template_key(cell.request.template) if entry.id not in packs else packs[entry.id][0]
                if entry.id not in packs:
                    packs[entry.id] = (template, {} if refresh else store.read_pack(identity[0], template))
                stored = None if refresh else store.side(identity, template, key, "tokens", packs[entry.id][1])
                if stored is not None:
                    result.tokens = dict(stored)
                    plans.append(None)
                    continue
                keep[len(plans)] = (template, key)
        plans.append((result, entry, facts, unknown, golden, len(asked) if ask else None))
        if ask:
            asked.append(feed_request(cell, facts))
    if identity is not None:
        store.count_tokens(sum(plan is None for plan in plans), len(asked))
    fed = list(runner.feeds_model_many(asked)) if asked else []
    found: dict = {}
    for position, plan in enumerate(plans):
        if plan is None:
            continue
        result, entry, facts, unknown, golden, index = plan
        answer = fed[index] if index is not None else None
        result.tokens = verdict_for(entry, facts, unknown, golden, answer)
        if position in keep and _storable(answer):
            template, key = keep[position]
            found.setdefault(template, {})[key] = ["tokens", result.tokens]
    for template, entries in found.items():
        store.write(identity, template, entries)


def template_summary(results: Iterable) -> dict:
    """template id -> {token status: count} over judged results that carry a token verdict."""
    out: dict = {}
    for result in results:
        verdict = result.tokens
        if verdict:
            row = out.setdefault(result.template_id, {})
            row[verdict["status"]] = row.get(verdict["status"], 0) + 1
    return out
