"""Engines at a chosen version: `NAME@VERSION` runner specs and per-version installs in the chatgold cache.

A version is installed on first use, from the engine's own registry only (PyPI through pip, npm through npm),
into a directory keyed by engine and version (~/.cache/chatgold/venvs/<engine>-<version>/ for a PyPI
package, ~/.cache/chatgold/npm/<package>-<version>/ for an npm one). Installs are staged in a temporary
directory and renamed into place under an exclusive lock, so concurrent first uses wait for one install
and never see a half-written one. A version the registry does not have, or that does not install here,
is a RunnerUnavailable naming the version and the registry's answer.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from .base import RunnerUnavailable

# What a version may look like: registry versions, never paths or options.
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}\Z")
MARKER = "chatgold-install.json"
LOG_TAIL = 3000


def cache_root() -> Path:
    configured = os.environ.get("CHATGOLD_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "chatgold"


def split_spec(spec: str) -> tuple[str, Optional[str]]:
    """'minijinja@2.10.2' -> ('minijinja', '2.10.2'); 'minijinja' -> ('minijinja', None)."""
    name, sep, version = spec.partition("@")
    if not sep:
        return spec, None
    version = version.strip()
    if not _VERSION.match(version):
        raise ValueError(f"runner spec {spec!r}: {version!r} is not a version (expected e.g. {name}@1.2.3)")
    return name, version


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """An exclusive lock on <cache>/locks/<name>.lock: the second caller waits for the first to finish."""
    directory = cache_root() / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _tail(text: str, limit: int = LOG_TAIL) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def _registry_refusal(output: str) -> Optional[str]:
    """pip's or npm's own line saying the version does not exist, when that is why the install failed."""
    for pattern in (r"(Could not find a version that satisfies the requirement [^\n]*)",
                    r"(No matching version found for [^\n]*)",
                    r"(No matching distribution found for [^\n]*)"):
        found = re.search(pattern, output)
        if found:
            return found.group(1).strip()
    return None


def _check_install(done, what: str, registry: str, tool: str) -> None:
    """Raise RunnerUnavailable for a failed pip/npm install, quoting the registry when the version is missing."""
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    refusal = _registry_refusal(output)
    if refusal:
        raise RunnerUnavailable(f"{what} cannot be had from {registry}: {refusal}")
    raise RunnerUnavailable(f"{what}: {tool} install failed (exit code {done.returncode}):\n{_tail(output)}")


def _read_marker(directory: Path) -> Optional[dict]:
    try:
        return json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def venv_dir(key: str) -> Path:
    return cache_root() / "venvs" / key


def venv_python(directory: Path) -> Path:
    return directory / "bin" / "python"


def installed_venv(key: str, requirements: Sequence[str]) -> Optional[Path]:
    """The python of a finished install of exactly these requirements, or None."""
    directory = venv_dir(key)
    marker = _read_marker(directory)
    if marker and marker.get("requirements") == list(requirements) and venv_python(directory).exists():
        return venv_python(directory)
    return None


def ensure_venv(key: str, requirements: Sequence[str], what: str, pip_options: Sequence[str] = (),
                env: Optional[dict] = None, timeout: float = 3600.0) -> Path:
    """A virtual environment holding `requirements` (pip specifiers), created once under <cache>/venvs/<key>.

    Returns its python. `what` names the engine and version in errors. `env` adds variables to pip's
    environment (e.g. CMAKE_ARGS for a source build)."""
    found = installed_venv(key, requirements)
    if found:
        return found
    root = venv_dir(key).parent
    root.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"venv-{key}"):
        found = installed_venv(key, requirements)
        if found:
            return found
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{key}-", dir=root))
        try:
            created = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(staging)],
                                     capture_output=True, text=True)
            if created.returncode != 0:
                raise RunnerUnavailable(f"{what}: cannot create a virtual environment: {_tail(created.stderr)}")
            python = venv_python(staging)
            argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input",
                    "--disable-pip-version-check", *pip_options, *requirements]
            print(f"[chatgold] installing {what} ({' '.join(requirements)}) into {venv_dir(key)}", file=sys.stderr,
                  flush=True)
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                      env=dict(os.environ, **(env or {})))
            except subprocess.TimeoutExpired:
                raise RunnerUnavailable(f"{what}: pip install did not finish within {timeout:.0f} s") from None
            _check_install(done, what, "PyPI", "pip")
            listed = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
                                     "{d.metadata['Name'].lower(): d.version for d in m.distributions()}))"],
                                    capture_output=True, text=True)
            packages = json.loads(listed.stdout) if listed.returncode == 0 else {}
            (staging / MARKER).write_text(json.dumps({
                "requirements": list(requirements), "pip_options": list(pip_options), "env": env or {},
                "packages": dict(sorted(packages.items())), "seconds": round(time.monotonic() - started, 1),
                "python": sys.version.split()[0]}, indent=2) + "\n", encoding="utf-8")
            target = venv_dir(key)
            if target.exists():  # a stale install of other requirements: replace it
                old = root / f".old-{key}-{os.getpid()}"
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            staging.rename(target)
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    return venv_python(venv_dir(key))


def install_record(key: str) -> Optional[dict]:
    """What ensure_venv recorded for an install (packages, seconds), or None."""
    return _read_marker(venv_dir(key))


def npm_dir(package: str, version: str) -> Path:
    return cache_root() / "npm" / f"{package.replace('/', '+').lstrip('@')}-{version}"


_EXACT_NPM_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?\Z")
_RESOLVED: dict = {}  # (package, tag or range) -> exact version, asked of npm once per process


def resolve_npm_version(package: str, version: str, what: str, timeout: float = 120.0) -> str:
    """An exact release for a dist-tag or range (`latest`, `3`, `^3.1`), asked of npm once per process; an exact
    version as it is. Installing the exact one means a retry finds it installed instead of downloading again."""
    if _EXACT_NPM_VERSION.match(version):
        return version
    key = (package, version)
    if key in _RESOLVED:
        return _RESOLVED[key]
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RunnerUnavailable(f"{what} needs node and npm on PATH")
    try:
        done = subprocess.run([npm, "view", "--json", f"{package}@{version}", "version"], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunnerUnavailable(f"{what}: npm did not answer which release {version!r} is within "
                                f"{timeout:g} s") from None
    found = None
    if done.returncode == 0:
        try:
            answer = json.loads(done.stdout or "null")
        except ValueError:
            answer = None
        if isinstance(answer, list) and answer:
            answer = answer[-1]  # a range: its newest matching release
        if isinstance(answer, str) and _EXACT_NPM_VERSION.match(answer):
            found = answer
    if found is None:
        why = (done.stderr or done.stdout or "").strip().splitlines()
        raise RunnerUnavailable(f"{what}: npm names no release of {package} for {version!r}"
                                + (f" ({why[-1][:200]})" if why else ""))
    _RESOLVED[key] = found
    return found


def ensure_npm_package(package: str, version: str, what: str, timeout: float = 600.0) -> Path:
    """`npm install <package>@<version>` (exact, no scripts) into <cache>/npm/<package>-<version>; returns its
    node_modules. A tag or range is resolved to its exact release first (resolve_npm_version)."""
    version = resolve_npm_version(package, version, what)
    target = npm_dir(package, version)
    modules = target / "node_modules"

    def installed() -> bool:
        manifest = modules.joinpath(*package.split("/"), "package.json")
        try:
            return json.loads(manifest.read_text(encoding="utf-8")).get("version") == version
        except (OSError, ValueError):
            return False

    if installed():
        return modules
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RunnerUnavailable(f"{what} needs node and npm on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"npm-{target.name}"):
        if installed():
            return modules
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{target.name}-", dir=target.parent))
        try:
            (staging / "package.json").write_text(json.dumps(
                {"name": "chatgold-engine", "version": "0.0.0", "private": True}) + "\n", encoding="utf-8")
            print(f"[chatgold] installing {what} ({package}@{version}) into {target}", file=sys.stderr, flush=True)
            done = subprocess.run([npm, "install", "--save-exact", "--ignore-scripts", "--no-audit", "--no-fund",
                                   "--loglevel=error", f"{package}@{version}"],
                                  cwd=staging, capture_output=True, text=True, timeout=timeout)
            _check_install(done, what, "npm", "npm")
            (staging / MARKER).write_text(json.dumps({"package": package, "version": version,
                                                      "seconds": round(time.monotonic() - started, 1)}) + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    if not installed():
        raise RunnerUnavailable(f"{what}: npm installed {package} but not version {version}")
    return modules


def checkout_harness(python: Path, module: str) -> tuple[list, dict]:
    """argv and environment running `<python> -m <module>` from this checkout: a harness module of this
    project executed by another installation's interpreter (it imports only the standard library and the
    engine that installation holds)."""
    from .harness import python_harness

    argv, env = python_harness(module)
    return [str(python), *argv[1:]], env


def main(argv: Optional[list] = None) -> int:
    """`python -m runners.versions SPEC...`: install each NAME@VERSION into the cache now (idempotent)."""
    import argparse

    from . import get_runner, parse_spec

    parser = argparse.ArgumentParser(prog="python -m runners.versions", description=main.__doc__)
    parser.add_argument("specs", nargs="+", metavar="NAME@VERSION")
    args = parser.parse_args(argv)
    for spec in args.specs:
        if parse_spec(spec)[1] is None:
            parser.error(f"{spec}: give NAME@VERSION")
        try:
            runner = get_runner(spec)
        except (RunnerUnavailable, ValueError) as exc:
            print(f"{spec}: {exc}", file=sys.stderr)
            return 1
        runner.close()
        print(f"{spec}: installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
