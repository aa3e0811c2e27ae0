"""What decides a runner's outcomes, as data: the identity chatgold's result store files outcomes under.

A runner's `identity()` (runners.base.Runner) names everything its outcome for a cell is a function of,
besides the template and the conversation: the engine and its version(s), and a digest of the code and
configuration between the request and the engine (the runner module, the harness, the protocol code that
carries the request and the answer). Anything left out could let an outcome recorded under an older build
stand for a newer one, so a runner that cannot say returns None and is never cached.
"""
from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache
from typing import Iterable, Optional

RUNNERS_DIR = os.path.dirname(os.path.abspath(__file__))
# The code every harness runner's outcome passes through: request types, the client, the Python harness
# server, the wire mapping.
PROTOCOL_FILES = ("base.py", "command.py", "harness.py", "protocol/__init__.py")
_SOURCE_SUFFIXES = (".py", ".json", ".mjs", ".md")


def _files(names: Iterable[str]) -> list:
    """(name relative to runners/, absolute path) for files and every source file under directories."""
    found = []
    for name in names:
        path = os.path.join(RUNNERS_DIR, name)
        if os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "node_modules"))
                for file in sorted(files):
                    if file.endswith(_SOURCE_SUFFIXES):
                        full = os.path.join(folder, file)
                        found.append((os.path.relpath(full, RUNNERS_DIR).replace(os.sep, "/"), full))
        else:
            found.append((name, path))
    return sorted(found)


@lru_cache(maxsize=64)
def source_digest(*names: str) -> str:
    """sha256 over these files of runners/ (directories: every source file in them), by relative name and
    exact bytes, so the same checkout gives the same digest on every machine."""
    digest = hashlib.sha256()
    for name, path in _files(names):
        with open(path, "rb") as handle:
            data = handle.read()
        for part in (name.encode(), data):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path) -> str:
    """sha256 of a file's bytes (a binary, a library), computed once per file version in a process."""
    stat = os.stat(path)
    return _file_sha256(os.fspath(path), stat.st_size, stat.st_mtime_ns)


def dist_versions(*dists: str) -> dict:
    """Installed versions of Python distributions ("missing" when absent), without importing them."""
    return {dist: _dist_version(dist) for dist in dists}


@lru_cache(maxsize=64)
def _dist_version(dist: str) -> str:
    # Asked once per process: each look-up walks every distribution on sys.path.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def python_identity() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def python_runner_identity(name: str, files: Iterable[str], dists: Iterable[str] = (), **extra) -> dict:
    """The identity of a runner whose engine is Python code (in this interpreter or a harness process
    started with it): its files plus the protocol's, the interpreter, the distributions it renders with."""
    return {"name": name, "python": python_identity(), "packages": dist_versions(*dists),
            "code": source_digest(*PROTOCOL_FILES, *files), **extra}


def harness_build(script: str, files: Iterable[str] = (), dists: Iterable[str] = (),
                  configuration: Optional[str] = None) -> str:
    """A protocol-2 `build` string for a Python harness shipped in runners/: its script, the other files of
    runners/ it renders with and the protocol code, the interpreter, the distributions it uses, and any
    configuration that changes its outcomes."""
    relative = os.path.relpath(os.path.abspath(script), RUNNERS_DIR).replace(os.sep, "/")
    parts = [f"code {source_digest(*PROTOCOL_FILES, relative, *files)[:16]}", python_identity()]
    parts.extend(f"{dist} {version}" for dist, version in sorted(dist_versions(*dists).items()))
    if configuration:
        parts.append(f"config {configuration}")
    return "; ".join(parts)
