"""Shared fixtures: real pinned sources from the cache (fetched by scripts/setup.sh), never downloaded here."""
from __future__ import annotations

import re
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

    from conformance.render.store import RESULTS_DIR_ENV

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


@pytest.fixture(scope="module")
def planted(request):
    """(reference, engine): the reference and the HF-faithful jinja2 harness (tests/harnesses/buggy_jinja2.py)
    with the bugs the test module names in PLANTED."""
    import shlex
    import sys

    from runners import get_runner

    harness = Path(__file__).parent / "harnesses" / "buggy_jinja2.py"
    argv = [sys.executable, str(harness)] + [arg for bug in request.module.PLANTED for arg in ("--bug", bug)]
    engine = get_runner("command:" + shlex.join(argv), workers=1, timeout=20)
    reference = get_runner("hf", workers=1)
    yield reference, engine
    engine.close()
    reference.close()


@pytest.fixture(scope="session")
def hf_renderer():
    from runners.hf import HFRenderer

    return HFRenderer()


# llama.cpp's own cases of its built-in formats (tests/test-chat-template.cpp in the pinned sdist, from the cache)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_LITERAL = re.compile(r'\s*(u8|U8C\()?"')


def _c_string(text: str, start: int) -> tuple[str, int]:
    """The C string literal opening at text[start] (a double quote): (value, index after it)."""
    out, i = [], start + 1
    while text[i] != '"':
        if text[i] == "\\":
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out), i + 1


def _string_field(block: str, start: int) -> str:
    """Adjacent literals (plain, u8"...", U8C("...")) from `start`, concatenated as the compiler does."""
    parts, i = [], start
    while (match := _LITERAL.match(block, i)) is not None:
        value, i = _c_string(block, match.end() - 1)
        parts.append(value)
        if match.group(1) == "U8C(":
            i = block.index(")", i) + 1
    return "".join(parts)


def llama_cpp_test_cases(source_file: Path) -> list[dict]:
    """The TestCase initialisers of main_automated_tests: name, template_str, expected_output, extra turns."""
    text = source_file.read_text(encoding="utf-8")
    start = text.index("std::vector<TestCase> test_cases {")
    body = text[start:text.index("\n    };", start)]
    cases = []
    for block in re.split(r"\n        \{\n", body)[1:]:
        fields: dict = {"extra_conversation": []}
        for match in re.finditer(r"/\* \.(\w+)=? \*/", block):
            name = match.group(1)
            if name == "extra_conversation":
                pairs = re.findall(r'\{"([^"]*)", ("(?:[^"\\]|\\.)*")\}', block[match.end():])
                fields[name] = [{"role": role, "content": _c_string(content, 0)[0]} for role, content in pairs]
            elif name != "supported_with_jinja":
                fields[name] = _string_field(block, match.end())
        cases.append(fields)
    return cases


@pytest.fixture(scope="session")
def llama_cpp_cases(cached_source_root) -> list[dict]:
    from conformance.corpus.sources.llamacpp import SOURCE

    (base,) = [p for p in cached_source_root(SOURCE).iterdir() if p.is_dir()]
    return llama_cpp_test_cases(base / "llama.cpp" / "tests" / "test-chat-template.cpp")
