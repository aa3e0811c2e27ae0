"""The template corpus: templates/<id>.jinja (byte-exact) described by templates/manifest.json.

Candidates from every source are merged by the sha256 of their exact bytes: one entry per hash, every origin
kept. bos/eos texts come from the candidate itself when its source says (a GGUF vocab, a tokenizer config),
else from the family table templates/families.json (published tokenizer configs); the entry records which.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import jinja2
import jinja2.ext
import jinja2.nodes

from conformance import repo_root
from conformance.corpus.sources import Candidate, all_sources, source_root
from conformance.judge.goldens import atomic_write
from runners.gguf_header import GGUFHeaderError, read_header

MANIFEST_FORMAT = 1
CONSTRUCTS_FILE = "constructs.json"
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
    bos_source: str = ""
    eos_source: str = ""
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


@dataclass
class Corpus:
    entries: list
    sources: dict
    root: Path

    def __post_init__(self):
        self.by_id = {e.id: e for e in self.entries}
        self.by_sha = {e.sha256: e for e in self.entries}

    def get(self, template_id: str) -> TemplateEntry:
        try:
            return self.by_id[template_id]
        except KeyError:
            raise CorpusError(f"unknown template id {template_id!r} (see `chatgold corpus list`)") from None

    def select(self, patterns: Optional[list[str]] = None) -> list[TemplateEntry]:
        if not patterns:
            return list(self.entries)
        return [e for e in self.entries if any(fnmatch.fnmatchcase(e.id, p) for p in patterns)]


def templates_dir() -> Path:
    return repo_root() / "templates"


def manifest_path(root: Optional[Path] = None) -> Path:
    return (root or templates_dir()) / "manifest.json"


def load_corpus(root: Optional[Path] = None) -> Corpus:
    root = Path(root) if root else templates_dir()
    path = manifest_path(root)
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


def _family_table(root: Path) -> dict:
    path = root / "families.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _detect_family(candidate: Candidate) -> str:
    if candidate.family:
        return candidate.family
    from conformance.corpus.families import detect_family

    return detect_family(candidate.text.decode("utf-8", "replace"), candidate.name or "", candidate.aliases)


def _origin(candidate: Candidate) -> dict:
    origin = {"source": candidate.source, "path": candidate.path, "key": candidate.key, "name": candidate.name,
              "aliases": list(candidate.aliases), "variant": candidate.variant}
    if candidate.license:
        origin["license"] = candidate.license
    if candidate.extra:
        origin["extra"] = candidate.extra
    return origin


def merge_candidates(candidates: Iterable[Candidate], families: dict, existing_ids: Optional[dict] = None) -> list[TemplateEntry]:
    """One entry per sha256, in first-seen order; ids stable across runs (existing_ids: sha256 -> id)."""
    groups: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        try:
            candidate.text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{candidate.source}:{candidate.path}: template is not UTF-8 (byte {exc.start})") from None
        groups.setdefault(candidate.sha256, []).append(candidate)
    entries: list[TemplateEntry] = []
    used: set[str] = set((existing_ids or {}).values())
    for sha, group in groups.items():
        first = group[0]
        template_id = (existing_ids or {}).get(sha)
        if template_id is None:
            template_id = make_id(first.name or Path(first.path).stem)
            if template_id in used:
                template_id = f"{template_id[:71]}-{sha[:8]}"
            used.add(template_id)
        family = next((c.family for c in group if c.family), None) or _detect_family(first)
        explicit = next((c for c in group if c.bos_source or c.eos_source), None)
        if explicit is not None:
            bos, eos = explicit.bos_token, explicit.eos_token
            bos_source = explicit.bos_source or "none: the source defines no BOS token"
            eos_source = explicit.eos_source or "none: the source defines no EOS token"
        elif family in families:
            row = families[family]
            bos, eos = row.get("bos_token"), row.get("eos_token")
            bos_source = eos_source = f"family table ({family}): {row.get('source', 'published tokenizer config')}"
        else:
            bos = eos = None
            bos_source = eos_source = f"unknown: no published tokenizer config recorded for family {family!r}"
        licenses = sorted({c.license for c in group if c.license})
        entries.append(TemplateEntry(
            id=template_id, sha256=sha, file=f"{template_id}.jinja", family=family,
            variant=next((c.variant for c in group if c.variant != "default"), "default"),
            generic=all(c.generic for c in group), license="; ".join(licenses) or None,
            bos_token=bos, eos_token=eos, bos_source=bos_source, eos_source=eos_source,
            origins=[_origin(c) for c in group],
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
    existing = {}
    if manifest_path(root).exists():
        existing = {e.sha256: e.id for e in load_corpus(root).entries}
    candidates: list[Candidate] = []
    sources = {}
    for source in all_sources():
        found = list(source.extract(source_root(source)))
        progress(f"{source.id}: {len(found)} templates")
        candidates.extend(found)
        sources[source.id] = source.describe()
    entries = merge_candidates(candidates, _family_table(root), existing)
    texts = {c.sha256: c.text for c in candidates}
    write_corpus(entries, sources, texts, root)
    return load_corpus(root)


# --- importing files a user points at -------------------------------------------------------------------------

def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def candidates_from_file(path: Path) -> list[Candidate]:
    """Templates in one file: .jinja, tokenizer_config.json, chat_template.json, or .gguf (header only)."""
    path = Path(path)
    source = "file"
    label = path.name
    if path.suffix == ".gguf":
        try:
            header = read_header(path)
        except GGUFHeaderError:
            raise
        except OSError as exc:
            raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
        templates = header.chat_templates()
        if not templates:
            raise CorpusError(f"{path}: GGUF has no tokenizer.chat_template key")
        bos, bos_id = header.special_token("bos")
        eos, eos_id = header.special_token("eos")
        stem = path.stem
        return [Candidate(
            text=text.encode("utf-8"), source=source, path=label, key=header.template_key(name),
            name=stem if name == "default" else f"{stem}-{name}", variant=name, bos_token=bos, eos_token=eos,
            bos_source=f"GGUF {label}: tokenizer.ggml.bos_token_id={bos_id}" if bos is not None else "none: GGUF has no BOS token",
            eos_source=f"GGUF {label}: tokenizer.ggml.eos_token_id={eos_id}" if eos is not None else "none: GGUF has no EOS token",
        ) for name, text in sorted(templates.items())]
    try:
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
            return [Candidate(text=template.encode("utf-8"), source=source, path=label, key="chat_template", name=stem, **tokens)]
        if isinstance(template, list):
            found = []
            for index, item in enumerate(template):
                if not isinstance(item, dict) or not isinstance(item.get("template"), str) or not isinstance(item.get("name"), str):
                    raise CorpusError(f"{path}: chat_template[{index}] must be an object with string name and template")
                found.append(Candidate(text=item["template"].encode("utf-8"), source=source, path=label,
                                       key=f"chat_template[{index}]", variant=item["name"],
                                       name=stem if item["name"] == "default" else f"{stem}-{item['name']}", **tokens))
            return found
        raise CorpusError(f"{path}: chat_template must be a string or a list of named templates")
    raise CorpusError(f"{path}: unsupported file type (expected .jinja, .json or .gguf)")


def import_files(paths: list[Path], root: Optional[Path] = None) -> list[TemplateEntry]:
    """Add templates from files to the corpus; nothing is written unless every file imports cleanly."""
    root = Path(root) if root else templates_dir()
    corpus = load_corpus(root) if manifest_path(root).exists() else Corpus([], {}, root)
    candidates = []
    for path in paths:
        found = candidates_from_file(Path(path))
        for candidate in found:
            try:
                compile_check(candidate.text.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}: template is not UTF-8 (byte {exc.start})") from None
            except SyntaxError as exc:
                raise CorpusError(f"{path}: template does not compile: {exc}") from None
        candidates.extend(found)
    new = [c for c in candidates if c.sha256 not in corpus.by_sha]
    added = merge_candidates(new, _family_table(root), {e.sha256: e.id for e in corpus.entries})
    texts = {e.sha256: e.source_bytes() for e in corpus.entries}
    texts.update({c.sha256: c.text for c in new})
    # Known hashes gain the new origin instead of a second entry.
    for candidate in candidates:
        entry = corpus.by_sha.get(candidate.sha256)
        if entry is not None and _origin(candidate) not in entry.origins:
            entry.origins.append(_origin(candidate))
    write_corpus(corpus.entries + added, corpus.sources, texts, root, prune=False)
    return added


def compile_check(text: str) -> None:
    """Raise SyntaxError (with the line) if Jinja cannot parse the template."""
    env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, GenerationTag])
    try:
        env.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise SyntaxError(f"line {exc.lineno}: {exc.message}") from None


class GenerationTag(jinja2.ext.Extension):
    """Parses transformers' `{% generation %}...{% endgeneration %}` so the compile check accepts it."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def sha256_text(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()
