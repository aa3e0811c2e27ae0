"""Build the Go harness (runners/ollama/harness) with the machine's Go toolchain, once per source digest.

The binary lands in <cache>/ollama-harness/<digest>/ollama-harness, built under a lock and renamed into
place, with GOCACHE and GOPATH inside the chatgold cache. The harness uses the standard library only, so the
build needs no module download: GOPROXY=off and GOFLAGS=-mod=mod are never needed, and a build that tries
the network fails instead. scripts/setup.sh installs Debian's golang-go when `go` is missing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..base import RunnerUnavailable
from ..versions import cache_lock, cache_root

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
SOURCES = ("go.mod", "main.go")
BINARY = "ollama-harness"


def source_digest() -> str:
    """sha256 over the harness's source files, by name and bytes."""
    digest = hashlib.sha256()
    for name in SOURCES:
        data = (HARNESS_DIR / name).read_bytes()
        for part in (name.encode(), data):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def go_binary() -> str:
    found = shutil.which("go")
    if found is None:
        raise RunnerUnavailable("the ollama runner needs Go to build its harness: `go` is not on PATH "
                                "(scripts/setup.sh installs Debian's golang-go)")
    return found


def go_version(go: str) -> str:
    done = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, env=go_env())
    return done.stdout.strip() or "unknown"


def go_env() -> dict:
    root = cache_root() / "go"
    return dict(os.environ, GOCACHE=str(root / "cache"), GOPATH=str(root / "path"), GOPROXY="off",
                GOFLAGS="", GOTOOLCHAIN="local", CGO_ENABLED="0", GO111MODULE="on")


def harness_path() -> Path:
    return cache_root() / "ollama-harness" / source_digest()[:16] / BINARY


def ensure_harness() -> Path:
    """The built harness for this checkout's sources; builds it when missing."""
    target = harness_path()
    if target.exists():
        return target
    go = go_binary()
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"ollama-harness-{target.parent.name}"):
        if target.exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent.parent))
        try:
            digest = source_digest()
            done = subprocess.run(
                [go, "build", "-trimpath", "-ldflags", f"-X main.build={digest[:16]}", "-o",
                 str(staging / BINARY), "."],
                cwd=HARNESS_DIR, capture_output=True, text=True, env=go_env(), timeout=600)
            if done.returncode != 0:
                raise RunnerUnavailable(f"building the ollama harness failed ({go} build, exit code "
                                        f"{done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
            (staging / "go-version").write_text(go_version(go) + "\n", encoding="utf-8")
            if target.parent.exists():
                shutil.rmtree(target.parent)
            staging.rename(target.parent)
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def built_go_version() -> str:
    """The Go release the cached harness was built with."""
    try:
        return (harness_path().parent / "go-version").read_text(encoding="utf-8").strip()
    except OSError:
        return "unknown"


def main() -> int:
    try:
        path = ensure_harness()
    except RunnerUnavailable as exc:
        print(f"ollama harness: {exc}", file=sys.stderr)
        return 1
    print(f"ollama harness: {path} ({built_go_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
