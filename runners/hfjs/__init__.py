"""@huggingface/jinja (the engine of transformers.js) in a persistent node process speaking the harness protocol.

The harness is runners/examples/harness.mjs, the JavaScript example engine authors start from (its engine,
runners/examples/hfjs_engine.mjs, renders as transformers.js's apply_chat_template does): the runner and the
example are one program. The package version is pinned exactly in package.json/package-lock.json beside this
file. On first use the runner installs it with `npm ci` from those two files into
~/.cache/chatgold/hfjs/<lock hash>/ (a new lock gets a new directory); CI pre-installs with
`python -m runners.hfjs --install`. `hfjs@VERSION` installs that npm release
instead (`npm install @huggingface/jinja@VERSION`, exact, no scripts) into <cache>/npm/huggingface+jinja-VERSION
(runners/versions.py) and renders with the same harness.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from typing import Optional

from ..base import RunnerUnavailable
from ..command import CommandRunner

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(os.path.dirname(HERE), "examples", "harness.mjs")
PACKAGE = "@huggingface/jinja"
HOMEPAGE = "https://github.com/huggingface/huggingface.js/tree/main/packages/jinja"
# The harness holds at most a few templates; a runaway template hits this heap cap rather than the machine,
# and the data-segment cap (RLIMIT_DATA, which V8's address-space reservations do not count against) bounds
# what lives outside the heap.
NODE_HEAP_MB = 512
NODE_MEMORY_LIMIT = 1024 * 1024**2


def cache_root() -> str:
    base = os.environ.get("CHATGOLD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chatgold")
    return os.path.join(base, "hfjs")


def pinned_version() -> str:
    with open(os.path.join(HERE, "package.json"), encoding="utf-8") as handle:
        return json.load(handle)["dependencies"][PACKAGE]


def _lock_digest() -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        with open(os.path.join(HERE, name), "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]


def install_dir() -> str:
    return os.path.join(cache_root(), _lock_digest())


def node_modules() -> str:
    return os.path.join(install_dir(), "node_modules")


def _installed() -> bool:
    return os.path.isfile(os.path.join(node_modules(), *PACKAGE.split("/"), "package.json"))


def ensure_installed(quiet: bool = True) -> str:
    """Install the pinned package with `npm ci` into the cache (once; concurrent callers wait). Returns node_modules."""
    if _installed():
        return node_modules()
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RunnerUnavailable("hfjs needs node and npm on PATH (node >= 18)")
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed():
            return node_modules()
        staging = tempfile.mkdtemp(prefix="staging-", dir=root)
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(os.path.join(HERE, name), staging)
            result = subprocess.run(
                [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=staging, capture_output=True, text=True, timeout=600,
            )
            if result.returncode != 0:
                raise RunnerUnavailable(
                    f"npm ci for {PACKAGE} (runners/hfjs/package-lock.json) failed with exit code "
                    f"{result.returncode}: {result.stderr.strip()[-2000:]}")
            target = install_dir()
            if os.path.exists(target):
                shutil.rmtree(target)
            os.rename(staging, target)
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    if not quiet:
        print(f"installed {PACKAGE}@{pinned_version()} into {install_dir()}")
    return node_modules()


class HFJSRunner(CommandRunner):
    """@huggingface/jinja, rendering as transformers.js's apply_chat_template does."""

    language = "javascript"
    homepage = HOMEPAGE

    def __init__(self, timeout: float = 20.0, workers: int = 1, node: Optional[str] = None,
                 version: Optional[str] = None, **options):
        node = node or shutil.which("node")
        if node is None:
            raise RunnerUnavailable("hfjs needs node on PATH (node >= 18)")
        if version is None:
            modules = ensure_installed()
        else:
            from ..versions import ensure_npm_package, resolve_npm_version

            # `latest` or a range: the exact release, resolved once (its name, its cache folder, its identity).
            version = resolve_npm_version(PACKAGE, version, f"@huggingface/jinja {version}")
            modules = str(ensure_npm_package(PACKAGE, version, f"@huggingface/jinja {version}"))
        env = dict(os.environ, TZ="UTC")
        argv = [node, f"--max-old-space-size={NODE_HEAP_MB}", HARNESS, "--modules", modules]
        options.setdefault("memory_limit", NODE_MEMORY_LIMIT)
        super().__init__(argv, name="hfjs" if version is None else f"hfjs@{version}", timeout=timeout,
                         workers=workers, env=env, **options)
        self.version = version or pinned_version()
        self.pinned = version is None
        self.node = node

    def identity(self) -> dict:
        from ..identity import PROTOCOL_FILES, source_digest

        # The harness and its engine, package.json and the lock (so the installed package), node itself, the protocol code.
        return {"name": self.name, "package": f"{PACKAGE}@{self.version}", "lock": _lock_digest() if self.pinned else None,
                "node": node_version(self.node), "code": source_digest(*PROTOCOL_FILES, "hfjs", "examples/harness.mjs",
                                                                    "examples/hfjs_engine.mjs")}


_NODE_VERSIONS: dict = {}


def node_version(node: str) -> str:
    """`node --version` of this binary, asked once per process."""
    if node not in _NODE_VERSIONS:
        try:
            done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
            _NODE_VERSIONS[node] = done.stdout.strip() or f"unknown (exit {done.returncode})"
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunnerUnavailable(f"cannot run {node} --version: {exc}") from exc
    return _NODE_VERSIONS[node]
