"""Shared fixtures: real pinned sources from the cache (fetched by scripts/setup.sh), never downloaded here."""
from __future__ import annotations

from pathlib import Path

import pytest


def _cached_root(source) -> Path:
    from conformance.corpus.sources import LocalSource, cached_archive

    if isinstance(source, LocalSource):
        return source.root()
    archive = cached_archive(source)
    if archive is not None:
        root = archive.with_name(archive.name + ".d")
        if root.exists():
            return root
    raise RuntimeError(f"{source.package}=={source.version} is not in the cache {source.cache_folder()}: run "
                       "scripts/setup.sh (tests never download)")


@pytest.fixture(scope="session", autouse=True)
def private_result_store(tmp_path_factory):
    """Every test (and every chatgold process a test starts) uses a result store of this session, never the
    user's: outcomes cached by one test run cannot answer for another."""
    import os

    from conformance.judge.store import RESULTS_DIR_ENV

    previous = os.environ.get(RESULTS_DIR_ENV)
    os.environ[RESULTS_DIR_ENV] = str(tmp_path_factory.mktemp("results"))
    yield os.environ[RESULTS_DIR_ENV]
    if previous is None:
        os.environ.pop(RESULTS_DIR_ENV, None)
    else:
        os.environ[RESULTS_DIR_ENV] = previous


@pytest.fixture(scope="session")
def cached_source_root():
    return _cached_root


@pytest.fixture(scope="session")
def llamacpp_models(cached_source_root) -> Path:
    from conformance.corpus.sources.llamacpp import MODELS_DIR, SOURCE

    root = cached_source_root(SOURCE)
    (base,) = [p for p in root.iterdir() if p.is_dir()]
    return base / MODELS_DIR


@pytest.fixture(scope="session")
def hf_renderer():
    from runners.hf import HFRenderer

    return HFRenderer()
