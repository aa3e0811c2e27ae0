"""Install the real `llama-cpp-python` from its PyPI sdist, CPU-only, once per version into the chatgold cache.

PyPI carries only source distributions of llama-cpp-python; `pip install` compiles the vendored llama.cpp
with CMake (scikit-build-core). The build here switches off what rendering a prompt does not need (native
CPU tuning, OpenMP, the multimodal library) and compiles at -O1: the Python package, its chat formatters and
the tokenizer of the real library are what the runner uses. The install lands in
`<cache>/venvs/llama-cpp-python-<version>/` (runners/versions.py: staged, locked, keyed by version).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..versions import ensure_venv, install_record, installed_venv

PACKAGE = "llama-cpp-python"
PINNED_VERSION = "0.3.36"   # PyPI 2026-10-01, vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG)
# llama-cpp-python leaves jinja2 unpinned (>=2.11.3): a fresh install gets the newest, 3.1.6.
JINJA2 = "jinja2==3.1.6"
# The harness writes its carrier GGUF files with the same writer as the llama.cpp runner (runners/llamacpp/model.py).
GGUF = "gguf==0.19.0"
CMAKE_ARGS = " ".join([
    "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DGGML_BLAS=OFF", "-DLLAVA_BUILD=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_C_FLAGS_RELEASE=-O1", "-DCMAKE_CXX_FLAGS_RELEASE=-O1",
])


def venv_key(version: str) -> str:
    return f"{PACKAGE}-{version}"


def requirements(version: str) -> list:
    return [f"{PACKAGE}=={version}", JINJA2, GGUF]


def find(version: str = PINNED_VERSION) -> Optional[Path]:
    return installed_venv(venv_key(version), requirements(version))


def ensure_built(version: str = PINNED_VERSION) -> Path:
    """The python of the cached install (building it first, several minutes on 2 cores)."""
    import os

    jobs = str(max(1, int(os.environ.get("CHATGOLD_BUILD_JOBS") or (os.cpu_count() or 1))))
    return ensure_venv(venv_key(version), requirements(version), f"{PACKAGE} {version}",
                       pip_options=["--no-binary", PACKAGE],
                       env={"CMAKE_ARGS": CMAKE_ARGS, "CFLAGS": "-DNDEBUG", "CXXFLAGS": "-DNDEBUG",
                            "CMAKE_BUILD_PARALLEL_LEVEL": jobs, "FORCE_CMAKE": "1"},
                       timeout=7200)


def build(force: bool = False, build: Optional[str] = None) -> Path:
    """`chatgold engines build llama-cpp-python [--version V]`: the cached install's python (force is not
    supported: delete the venv directory to rebuild)."""
    return ensure_built(build or PINNED_VERSION)


def build_info(version: str = PINNED_VERSION) -> Optional[dict]:
    return install_record(venv_key(version))
