"""What "differs in the same way" means: a normalised symptom of one (reference outcome, engine outcome) pair.

- diverged: the set of edits that turn the reference's text into the engine's, from a character-level diff
  (difflib, no junk heuristic), each edit a (deleted, inserted) pair. Digit runs read as 0 and letter runs as
  `a`, except a short all-letter edit (`True` -> `true`), which is kept as it is: content that a reducer
  shortens must not make the same bug look new, and a keyword printed differently must not look like any
  other word.
- engine-raised, raised-differently: the engine's refusal (kind + first line of its message, numbers and the
  engine's location suffixes normalised).
- engine-rendered: the reference's refusal the engine lacks (kind + message, normalised alike).

A candidate keeps the original difference when its status is the same and, for diverged pairs, its first edit
(in text order) is the original's first edit, whatever else it shows; for refusals, when the symptom is equal.
"""
from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field
from typing import Optional

from conformance.files import ENCODING_ERRORS
from conformance.judge.classify import classify
from conformance.judge.goldens import Golden, golden_bytes
from conformance.judge.status import NON_MATCHING, Status
from runners.base import Errored, Outcome, Raised, Rendered, Skipped, outcome_to_dict

# Above this many characters of differing middle on either side, diff line by line first, then characters
# inside each changed block (difflib is quadratic).
CHAR_DIFF_LIMIT = 4000
# Above this product of the two sides' token counts, diff lines first (see _line_edits).
TOKEN_DIFF_LIMIT = 40_000
SHORT_WORD = 8
_DIGITS = re.compile(r"\d+")
_TOKENS = re.compile(r"\s+|\w+|[^\w\s]")
_ALNUM = re.compile(r"[^\W_]")
_WORDS = re.compile(r"a(?:[ ,.:;'-]*a)*")   # a run of words, with spaces and light punctuation between
_NUMBERS = re.compile(r"0(?:[.,]0)*")
_LETTERS = re.compile(r"[^\W\d_]+")
_RUNS = re.compile(r"(\s)\1+")
# Engine location suffixes and positions that change as a template shrinks.
_LOCATION = re.compile(r"\s*\((?:in|at) [^()]*:\d+(?::\d+)?\)|\bat (?:row|line) \d+,? (?:col(?:umn)? \d+)?"
                       r"|\bline \d+\b|\bcolumn \d+\b")


@dataclass(frozen=True)
class Symptom:
    """How one engine outcome differs from the reference's on the same input."""

    status: Status
    edits: frozenset = frozenset()   # diverged: normalised (deleted, inserted) pairs
    refusal: str = ""                # the refusal that is the symptom (see the module docstring)
    # diverged: the first edit in text order, normalised. A candidate keeps the difference when its own first
    # edit is this one, whatever else it shows: a reduction isolates this cell's first difference and is not
    # stopped by a second, independent one that a smaller template or case brings out.
    first: tuple = field(default=(), compare=False)

    @property
    def differs(self) -> bool:
        return self.status in NON_MATCHING

    def keeps(self, target: "Symptom") -> bool:
        """Whether this (a candidate's) symptom is the `target`'s difference, in the same way."""
        if not self.differs:
            return False
        if self.status != target.status and not (
                # The engine refusing where the reference refuses too, for a reason of its own (raised-
                # differently), is the engine's refusal: a candidate where the reference now renders and the
                # engine still refuses so has left out only what made the reference refuse (the template's own
                # check further on), a second difference the reduction goes past.
                target.status == Status.RAISED_DIFFERENTLY and self.status == Status.ENGINE_RAISED):
            return False
        if self.status == Status.DIVERGED:
            if target.first:
                return self.first == target.first
            return bool(self.edits) and self.edits <= target.edits
        return self.refusal == target.refusal

    def first_key(self) -> str:
        """A canonical text, equal for symptoms that are the same difference (grouping): the first edit of
        different bytes, the refusal of a refusal."""
        if self.status == Status.DIVERGED and self.first:
            return f"{self.status}\x1d{self.first[0]}\x1f{self.first[1]}"
        return self.key()

    def key(self) -> str:
        """A canonical text, equal for equal symptoms (cache keys)."""
        if self.status == Status.DIVERGED:
            body = "\x1e".join(f"{d}\x1f{i}" for d, i in sorted(self.edits))
        else:
            body = self.refusal
        return f"{self.status}\x1d{body}"

    def digest(self) -> str:
        return hashlib.sha256(self.key().encode("utf-8", ENCODING_ERRORS)).hexdigest()[:16]

    def to_dict(self) -> dict:
        data: dict = {"status": str(self.status)}
        if self.status == Status.DIVERGED:
            data["edits"] = [list(edit) for edit in sorted(self.edits)]
        else:
            data["refusal"] = self.refusal
        return data


def normalise_text(text: str) -> str:
    """One side of an edit: kept when it is a short word; else digit runs read as 0, letter runs as a, and a
    run of words and numbers with the spaces and light punctuation between them as one `…` (content a
    reducer shortens, or another case words differently, does not make the same edit look new)."""
    if len(text) <= SHORT_WORD and text.isalpha():
        return text
    if text and not text.strip():
        # whitespace: a run of one character is that character once (an indentation's width is the
        # template's, not the engine's: the same missing lstrip_blocks at any depth)
        return _RUNS.sub(r"\1", text)
    text = _LETTERS.sub("a", _DIGITS.sub("0", text))
    return _NUMBERS.sub("0", _WORDS.sub("a", text))


def first_line(message: str) -> str:
    """A refusal message as a title shows it: its first line, without locations (digits kept). A message that
    wraps another error (llama.cpp: "Unable to generate parser for this template. ... failed:" over the
    template's own "Error: ..." line) keeps the innermost error too: the wrapper alone would make one refusal of
    every error it wraps."""
    lines = (message or "").strip().splitlines()
    first = lines[0] if lines else ""
    inner = [line.strip() for line in lines[1:] if line.strip().startswith("Error:")]
    if inner and inner[-1] not in first:
        first = f"{first.rstrip()} … {inner[-1]}"
    return _LOCATION.sub("", first).strip()


def normalise_message(message: str) -> str:
    """An engine's or the reference's refusal message as symptoms compare it: its first line, without
    locations, digits as 0."""
    return _DIGITS.sub("0", first_line(message))[:300]


def _raw_edits(a: str, b: str) -> list:
    """(deleted, inserted) pairs turning `a` into `b`."""
    prefix = 0
    limit = min(len(a), len(b))
    while prefix < limit and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    if prefix + suffix == limit and len(a) != len(b):
        slid = _slid_insertion(a, b, prefix)
        if slid is not None:
            return [slid]
    # back to word boundaries: a word is compared whole
    while prefix > 0 and a[prefix - 1].isalnum():
        prefix -= 1
    while suffix > 0 and a[len(a) - suffix].isalnum():
        suffix -= 1
    a, b = a[prefix:len(a) - suffix], b[prefix:len(b) - suffix]
    if not a and not b:
        return []
    # Words, whitespace runs and single punctuation marks first (so one word replaced by another is one edit,
    # and a prompt on one long line diffs fast), then characters inside a changed run without letters or
    # digits (whitespace and punctuation).
    a_tokens, b_tokens = _TOKENS.findall(a), _TOKENS.findall(b)
    if len(a_tokens) * len(b_tokens) > TOKEN_DIFF_LIMIT:
        return _line_edits(a, b)
    return _token_edits(a_tokens, b_tokens)


def _slid_insertion(a: str, b: str, at: int) -> Optional[tuple]:
    """One side inserts a piece at `at`: the piece slid to its leftmost place, so a repeated piece is the piece
    itself (`<s><s>x` against `<s>x` inserts `<s>`, not `s><`); None when it then starts or ends inside a word
    (a word is compared whole: the caller's diff does that)."""
    long_, width = (b, len(b) - len(a)) if len(b) > len(a) else (a, len(a) - len(b))
    while at > 0 and long_[at - 1] == long_[at + width - 1]:
        at -= 1
    end = at + width
    if (at > 0 and long_[at - 1].isalnum() and long_[at].isalnum()) or \
            (end < len(long_) and long_[end - 1].isalnum() and long_[end].isalnum()):
        return None
    piece = long_[at:end]
    return ("", piece) if len(b) > len(a) else (piece, "")


def _line_edits(a: str, b: str) -> list:
    """Two texts too far apart for a token diff (difflib is cubic on long runs of repeated tokens such as single
    spaces: an engine with its own format against a template's, 1,000 words each, took a minute): lines first,
    then tokens inside each changed block small enough, the rest of a block one edit."""
    a_lines, b_lines = a.splitlines(keepends=True), b.splitlines(keepends=True)
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a_lines, b_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        left, right = "".join(a_lines[i1:i2]), "".join(b_lines[j1:j2])
        a_tokens, b_tokens = _TOKENS.findall(left), _TOKENS.findall(right)
        if len(a_tokens) * len(b_tokens) <= TOKEN_DIFF_LIMIT:
            out.extend(_token_edits(a_tokens, b_tokens))
        else:
            out.append((left, right))
    return out


def _token_edits(a_tokens: list, b_tokens: list) -> list:
    out = []
    matcher = difflib.SequenceMatcher(None, a_tokens, b_tokens, autojunk=False)
    changes = []   # (i1, i2, j1, j2): changed runs, merged across equal runs of single spaces between words
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            if changes and all(t == " " for t in a_tokens[i1:i2]) and i2 - i1 == 1 and i2 < len(a_tokens):
                changes[-1] = changes[-1] + ("space",)
            continue
        if changes and len(changes[-1]) == 5:
            first = changes.pop()
            changes.append((first[0], i2, first[2], j2))
        else:
            changes.append((i1, i2, j1, j2))
    for i1, i2, j1, j2, *_ in changes:
        tag = "replace" if i1 < i2 and j1 < j2 else "other"
        left, right = "".join(a_tokens[i1:i2]), "".join(b_tokens[j1:j2])
        if (tag == "replace" and len(left) <= CHAR_DIFF_LIMIT and len(right) <= CHAR_DIFF_LIMIT
                and not _ALNUM.search(left) and not _ALNUM.search(right)):
            out.extend(_char_edits(left, right))
        else:
            out.append((left, right))
    return out


def _char_edits(a: str, b: str) -> list:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def edits(reference: str, engine: str) -> frozenset:
    return frozenset((normalise_text(d), normalise_text(i)) for d, i in _raw_edits(reference, engine))


FIRST_WINDOW = 600   # characters of each side, past the common prefix, that the first edit is looked for in


def first_edit(reference: str, engine: str) -> tuple:
    """The first (deleted, inserted) edit in text order, raw: the first change of a character diff of a window
    past the common prefix, so it is the same local edit however long and however different the rest is (a
    whole-text diff of long texts falls back to lines, and an indentation dropped all through a JSON object
    aligns no token of one side with the other). An insertion or deletion is slid to its leftmost place
    (`<s><s>x` against `<s>x` inserts `<s>`); a change inside a word is widened to the whole word."""
    a, b = reference, engine
    prefix = 0
    limit = min(len(a), len(b))
    while prefix < limit and a[prefix] == b[prefix]:
        prefix += 1
    if prefix == len(a) == len(b):
        return ()
    wa, wb = a[prefix:prefix + FIRST_WINDOW], b[prefix:prefix + FIRST_WINDOW]
    ops = [op for op in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:   # the windows agree; the difference is past them (one side is longer)
        ops = [("replace", len(wa), len(wa), len(wb), len(wb))]
    _, i1, i2, j1, j2 = ops[0]
    i1, i2, j1, j2 = i1 + prefix, i2 + prefix, j1 + prefix, j2 + prefix
    # one side only: slide left while the piece's last character repeats just before it (all before the
    # first change is common to both sides, so the piece stays a piece of the same texts)
    if i1 == i2:
        while j1 > 0 and i1 > 0 and b[j1 - 1] == b[j2 - 1]:
            i1, i2, j1, j2 = i1 - 1, i2 - 1, j1 - 1, j2 - 1
    elif j1 == j2:
        while i1 > 0 and j1 > 0 and a[i1 - 1] == a[i2 - 1]:
            i1, i2, j1, j2 = i1 - 1, i2 - 1, j1 - 1, j2 - 1
    while i1 > 0 and j1 > 0 and a[i1 - 1].isalnum() and (
            (i1 < len(a) and a[i1].isalnum()) or (j1 < len(b) and b[j1].isalnum())):
        i1, j1 = i1 - 1, j1 - 1
    while (i2 < len(a) and a[i2].isalnum() and i2 > 0 and a[i2 - 1].isalnum()) or \
            (j2 < len(b) and b[j2].isalnum() and j2 > 0 and b[j2 - 1].isalnum()):
        if i2 < len(a) and a[i2].isalnum() and i2 > 0 and a[i2 - 1].isalnum():
            i2 += 1
        if j2 < len(b) and b[j2].isalnum() and j2 > 0 and b[j2 - 1].isalnum():
            j2 += 1
    return a[i1:i2], b[j1:j2]


def diverged(reference: str, engine: str) -> Symptom:
    """The symptom of two different texts: their normalised edits, and the first edit in text order."""
    raw = _raw_edits(reference, engine)
    first = first_edit(reference, engine) if raw else ()
    return Symptom(Status.DIVERGED, frozenset((normalise_text(d), normalise_text(i)) for d, i in raw),
                   first=(normalise_text(first[0]), normalise_text(first[1])) if first else ())


def raw_edits(reference: str, engine: str) -> list:
    """The edits before normalisation (titles quote them)."""
    return _raw_edits(reference, engine)


def _refusal_text(kind, message: str) -> str:
    return f"{kind}: {normalise_message(message)}"


def symptom_of(golden: Optional[Golden], engine: Outcome) -> Optional[Symptom]:
    """The symptom of an engine outcome against the reference's (as a golden); None when the pair cannot be
    compared (the engine errored, timed out or skipped; no golden). For a pair nobody judged yet (a
    candidate); a judged cell's symptom comes from its status (symptom_for)."""
    return symptom_for(classify(golden, engine).status, golden, engine)


def symptom_for(status: Status, golden: Optional[Golden], engine: Outcome) -> Optional[Symptom]:
    """The symptom of a pair whose status the judge stage decided already (the cell is not classified
    again); None when it cannot be compared (no golden, or the engine gave no answer)."""
    if golden is None or isinstance(engine, (Errored, Skipped)):
        return None
    if status == Status.DIVERGED:
        return diverged(golden.text, engine.text)
    if status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        return Symptom(status, refusal=_refusal_text(engine.refusal, engine.message))
    if status == Status.ENGINE_RENDERED:
        return Symptom(status, refusal=_refusal_text(golden.refusal.kind, golden.refusal.message))
    return Symptom(status)


def reference_golden(outcome: Outcome) -> Optional[Golden]:
    """The reference's outcome in the form goldens store it; None when it is not an answer (errored)."""
    if isinstance(outcome, (Rendered, Raised)):
        kind, data = golden_bytes(outcome)
        return Golden(kind, data)
    return None


def compare(reference: Outcome, engine: Outcome) -> Optional[Symptom]:
    """The symptom of a freshly rendered pair."""
    return symptom_of(reference_golden(reference), engine)


def outcome_record(outcome: Outcome) -> dict:
    """An outcome as the explanation keeps it (schema: conformance/schemas/explain.schema.json)."""
    return outcome_to_dict(outcome)
