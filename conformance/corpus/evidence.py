"""Special tokens from evidence only: each template's bos/eos and add-bos/add-eos flags, read from pinned files.

Evidence is a real tokenizer file inside a pinned archive (conformance/corpus/sources: tokenizer_config.json,
special_tokens_map.json, a GGUF vocab), recorded in templates/evidence.json. Remembered values are not
evidence: where no file says a value, the entry says "unknown" and why.

The rule, per field (bos_token, eos_token, add_bos_token, add_eos_token), strongest basis first:

1. origin: the file the template itself was taken from (a GGUF's embedded template, an imported config);
2. template: a file carrying a chat template byte-identical to this template;
3. template-normalised: the same after folding CRLF and trailing newlines (copies differ only so in transit);
4. model: a file the package names after one of the models that ship this template;
5. family: the tokenizer files of the template's family (not base models': a base model's EOS is not its chat
   model's), used only when every one of them states the field and all agree.

The first basis with files decides; a weaker basis never fills in what a stronger one leaves out (a field
the template's own tokenizer file does not state is the tokenizer class's default: code, not evidence).
Within a basis, files naming one of the template's models win; otherwise the value most packages state
(one vote per package); a tie is a conflict and leaves the field unknown. Disagreeing files are always
recorded under "conflict". Templates shared across model lines (no family has a majority of the names that
ship them) and families that name a format rather than one tokenizer get no template or family evidence:
their tokens vary with the model.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.corpus.sources._tokenizer import FIELDS, TokenFile

EVIDENCE_FILE = "evidence.json"
EVIDENCE_FORMAT = 1
BASES = ("origin", "template", "template-normalised", "model", "family")
UNKNOWN = "unknown"

# Families that name a conversation format or a fine-tune line built on several base models: one member's
# tokenizer does not speak for another's (Hermes on Llama and Mistral, Nemotron on Llama, Mistral, Gemma...).
FORMAT_FAMILIES = frozenset({
    "chatml", "alpaca", "vicuna", "zephyr", "metharme", "hermes", "openchat", "llava", "idefics", "nemotron",
    "unknown",
})

_KIND_NAMES = {"tokenizer_config": "tokenizer_config.json", "special_tokens_map": "special_tokens_map.json",
               "gguf": "GGUF vocab"}


class EvidenceError(ValueError):
    """The evidence table is unusable; the message names the file."""


@dataclass
class EvidenceTable:
    files: list = field(default_factory=list)      # TokenFile
    sources: dict = field(default_factory=dict)    # source id -> PackageSource.describe()

    def __post_init__(self):
        self.by_id = {f.id: f for f in self.files}

    def to_dict(self) -> dict:
        return {"format": EVIDENCE_FORMAT, "sources": dict(sorted(self.sources.items())),
                "files": [f.to_dict() for f in sorted(self.files, key=lambda f: f.id)]}


def evidence_path(root: Path) -> Path:
    return Path(root) / EVIDENCE_FILE


def load_evidence(root: Path) -> EvidenceTable:
    """The committed evidence table (empty when the corpus folder has none)."""
    path = evidence_path(root)
    if not path.exists():
        return EvidenceTable()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != EVIDENCE_FORMAT:
        raise EvidenceError(f"{path}: unsupported evidence format {data.get('format') if isinstance(data, dict) else data!r}")
    try:
        files = [TokenFile.from_dict(item) for item in data["files"]]
    except (KeyError, TypeError) as exc:
        raise EvidenceError(f"{path}: malformed file record ({exc})") from None
    return EvidenceTable(files, data.get("sources", {}))


def collect_evidence(source_root: Callable, progress=print) -> EvidenceTable:
    """Every tokenizer file of every pinned evidence source (source_root fetches or finds the archive)."""
    from conformance.corpus.sources import evidence_sources

    files, sources = [], {}
    for source in evidence_sources():
        found = list(source.tokens(source_root(source)))
        progress(f"{source.id}: {len(found)} tokenizer files")
        files.extend(found)
        sources[source.id] = source.describe()
    return EvidenceTable(files, sources)


# --- facts about one template ----------------------------------------------------------------------------

@dataclass
class TemplateFacts:
    sha256: str
    normalised: str                    # sha256 of the newline-normalised text
    family: str
    models: frozenset = frozenset()    # lowercased model names (after "org/"), and "slug:org-model" names
    origins: frozenset = frozenset()   # (source id, path) the template was taken from
    shared: Optional[str] = None       # why template equality says nothing about tokens, if it does not
    own_files: list = field(default_factory=list)  # TokenFiles carried by the candidates (imported files)


def model_name(alias: str) -> str:
    return alias.rsplit("/", 1)[-1].lower()


def names_model(token_file: TokenFile, facts: TemplateFacts) -> bool:
    """Whether the package names this file after one of the models that ship the template."""
    if not token_file.model:
        return False
    model = token_file.model.lower()
    return model in facts.models or any(n.startswith("slug:") and n.endswith("-" + model) for n in facts.models)


def files_by_template(table: EvidenceTable) -> tuple[dict, dict]:
    """sha256 -> [(file, template name)] and normalised sha256 -> [(file, template name)]."""
    exact: dict = {}
    normalised: dict = {}
    for token_file in table.files:
        for name, record in token_file.templates.items():
            exact.setdefault(record["sha256"], []).append((token_file, name))
            normalised.setdefault(record["normalised"], []).append((token_file, name))
    return exact, normalised


def template_files(facts: TemplateFacts, exact: dict, normalised: dict) -> tuple[list, list]:
    """(files with this exact template, files with it only after newline normalisation), each once."""
    same = _unique(f for f, _ in exact.get(facts.sha256, []))
    ids = {f.id for f in same}
    close = _unique(f for f, _ in normalised.get(facts.normalised, []) if f.id not in ids)
    return same, close


def _unique(files: Iterable[TokenFile]) -> list:
    seen, out = set(), []
    for token_file in files:
        if token_file.id not in seen:
            seen.add(token_file.id)
            out.append(token_file)
    return out


def family_files(table: EvidenceTable, entry_family_of: dict, label_family: Callable[[str], Optional[str]]) -> dict:
    """family -> the tokenizer files that speak for it.

    A file carrying a chat template that a corpus template shares (exactly) belongs to that template's
    family; a shared template's files belong to no family; any other file belongs to the family its label
    names, if the package's labels name lines. Base-model files are left out (see `is_base_model`).
    entry_family_of: template sha256 -> family, or None for a shared template."""
    out: dict = {}
    for token_file in table.files:
        if is_base_model(token_file):
            continue
        shas = [r["sha256"] for r in token_file.templates.values()]
        known = [sha for sha in shas if sha in entry_family_of]
        if known:
            families = {entry_family_of[sha] for sha in known}
            family = families.pop() if len(families) == 1 else None
        else:
            family = _label_family(token_file.label, label_family) if token_file.label_names_line else None
        if family and family not in FORMAT_FAMILIES:
            out.setdefault(family, []).append(token_file)
    return out


def _label_family(label: str, label_family: Callable[[str], Optional[str]]) -> Optional[str]:
    # A bare label is a whole name: "yi" is the Yi line (the name rules want "yi" followed by a separator).
    return label_family(label) or label_family(f"{label}-")


_BASE_LABEL = re.compile(r"(?:^|[-_.])base(?:[-_.]|$)")


def is_base_model(token_file: TokenFile) -> bool:
    """A file its package marks as a base model's (a "-base" label), or a GGUF vocab without a chat template
    (llama.cpp's tokenizer test files, converted --vocab-only from the base checkpoints its
    convert_hf_to_gguf_update.py lists): a base model's EOS is not its chat model's."""
    if token_file.kind == "gguf" and not token_file.templates:
        return True
    return bool(_BASE_LABEL.search(token_file.label.lower()))


# --- the decision ----------------------------------------------------------------------------------------

def _file_ref(token_file: TokenFile, sources: dict, stated_in: Optional[str] = None) -> dict:
    source = sources.get(token_file.source, {})
    ref = {"package": source.get("package", token_file.source), "version": source.get("version"),
           "path": stated_in or token_file.path, "kind": token_file.kind}
    if source.get("registry"):
        ref["registry"] = source["registry"]
    return ref


def _short_ref(token_file: TokenFile, sources: dict) -> str:
    source = sources.get(token_file.source, {})
    package = source.get("package", token_file.source)
    version = source.get("version")
    return f"{package}@{version}:{token_file.path}" if version else f"{package}:{token_file.path}"


def _tiers(facts: TemplateFacts, table: EvidenceTable, exact: dict, normalised: dict, by_family: dict):
    """[(basis, files)] in order of strength, only the bases that have files, plus why a basis was skipped."""
    tiers = []
    notes = []
    same, close = template_files(facts, exact, normalised)
    origin = [f for f in same if (f.source, f.path) in facts.origins] + list(facts.own_files)
    if origin:
        tiers.append(("origin", origin))
    origin_ids = {f.id for f in origin}
    same = [f for f in same if f.id not in origin_ids]
    if facts.shared:
        if same or close:
            notes.append(f"{facts.shared}; ignored files with the same template: "
                         + ", ".join(_short_ref(f, table.sources) for f in same + close))
        else:
            notes.append(facts.shared)
        return tiers, notes
    if same:
        tiers.append(("template", same))
    if close:
        tiers.append(("template-normalised", close))
    named = [f for f in table.files if names_model(f, facts) and f.id not in origin_ids]
    if named:
        tiers.append(("model", named))
    if facts.family in FORMAT_FAMILIES:
        notes.append(f"family {facts.family!r} names a format shared by several model lines")
    elif by_family.get(facts.family):
        tiers.append(("family", by_family[facts.family]))
    else:
        notes.append(f"no pinned tokenizer file of family {facts.family!r}")
    return tiers, notes


def _values(files: list, name: str) -> dict:
    """value -> files stating it (JSON-comparable values: None is "no such token")."""
    out: dict = {}
    for token_file in files:
        if name in token_file.stated:
            out.setdefault(json.dumps(token_file.stated[name]["value"]), []).append(token_file)
    return out


def decide_field(name: str, tiers: list, notes: list, facts: TemplateFacts, sources: dict) -> dict:
    """The evidence record of one field (see the module doc for the rule)."""
    for index, (basis, files) in enumerate(tiers):
        values = _values(files, name)
        if basis == "family":
            silent = [f for f in files if name not in f.stated]
            if silent or len(values) != 1:
                why = (f"family {facts.family!r}: " + ("its files disagree" if len(values) > 1 else
                       f"{len(silent)} of its {len(files)} tokenizer files do not state {name}"))
                return _unknown(why, _conflict(values, sources, basis) if len(values) > 1 else None)
        if not values:
            return _unknown(f"the {basis} tokenizer file(s) do not state {name} (the tokenizer class's default "
                            f"applies: code, not evidence): "
                            + ", ".join(_short_ref(f, sources) for f in files))
        conflict = _conflict(values, sources, basis) if len(values) > 1 else []
        winner, rule = _winner(values, facts)
        # Weaker template-level files that disagree are recorded too (never the family's: too broad to matter).
        for weaker, weaker_files in tiers[index + 1:]:
            if weaker != "family":
                conflict += _conflict({v: f for v, f in _values(weaker_files, name).items() if v != winner},
                                      sources, weaker)
        if winner is None:
            return _unknown(f"{basis} evidence conflicts and no rule breaks the tie", conflict)
        record = {"status": "evidence", "value": json.loads(winner), "basis": basis, "rule": rule,
                  "files": [_file_ref(f, sources, f.stated[name]["file"]) for f in values[winner]]}
        if conflict:
            record["conflict"] = conflict
        return record
    return _unknown("; ".join(notes) or "no pinned tokenizer file")


def _winner(values: dict, facts: TemplateFacts) -> tuple[Optional[str], str]:
    if len(values) == 1:
        return next(iter(values)), "agreed" if sum(len(v) for v in values.values()) > 1 else "single file"
    named = {v for v, files in values.items() if any(names_model(f, facts) for f in files)}
    if len(named) == 1:
        return named.pop(), "the file naming the model"
    votes = Counter({v: len({f.source for f in files}) for v, files in values.items()})
    (top, top_votes), (_, second) = votes.most_common(2)
    if top_votes > second:
        return top, "majority of packages"
    return None, "tie"


def _conflict(values: dict, sources: dict, basis: str) -> list:
    return [{"value": json.loads(v), "basis": basis, "files": [_short_ref(f, sources) for f in files]}
            for v, files in sorted(values.items())]


def _unknown(why: str, conflict: Optional[list] = None) -> dict:
    record = {"status": UNKNOWN, "value": None, "why": why}
    if conflict:
        record["conflict"] = conflict
    return record


def decide(facts: TemplateFacts, table: EvidenceTable, exact: dict, normalised: dict, by_family: dict) -> dict:
    """field -> evidence record, for bos_token, eos_token, add_bos_token, add_eos_token."""
    tiers, notes = _tiers(facts, table, exact, normalised, by_family)
    return {name: decide_field(name, tiers, notes, facts, table.sources) for name in FIELDS}


def describe_record(record: dict) -> str:
    """One line for bos_source / eos_source: where the value comes from, or "unknown: why"."""
    if record["status"] == UNKNOWN:
        return f"{UNKNOWN}: {record['why']}"
    first = record["files"][0]
    more = f" (+{len(record['files']) - 1} agreeing)" if len(record["files"]) > 1 else ""
    version = f" {first['version']}" if first.get("version") else ""
    registry = f" ({first['registry']})" if first.get("registry") else ""
    kind = _KIND_NAMES.get(first["kind"], first["kind"])
    prefix = "none: " if record["value"] is None else ""
    disputed = "; conflicting files recorded" if record.get("conflict") else ""
    return f"{prefix}{record['basis']} evidence, {kind} of {first['package']}{version}{registry}: {first['path']}{more}{disputed}"


# --- which goldens depend on an unknown token ----------------------------------------------------------------

TOKEN_VARIABLES = ("bos_token", "eos_token")


def reads_variables(constructs: Optional[list], text: Optional[str] = None) -> set:
    """bos_token / eos_token among the variables a template reads: from its recorded constructs ("var:x"),
    else (no record, or a template Jinja cannot parse) by the name appearing in its text."""
    if constructs is not None and not any(str(c).startswith("error:") for c in constructs):
        return {v for v in TOKEN_VARIABLES if f"var:{v}" in constructs}
    if text is None:
        return set(TOKEN_VARIABLES)  # nothing to go by: assume it may
    return {v for v in TOKEN_VARIABLES if v in text}
