"""Engine runners behind one interface (see runners.base). Look one up by name with `get_runner`."""
from __future__ import annotations

import importlib
import shlex

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


def cost_hint(spec: str) -> float:
    """The runner class's `cost_hint` for a spec, without starting anything."""
    target = BUILTIN_RUNNERS.get(spec)
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
    try:
        target = BUILTIN_RUNNERS[spec]
    except KeyError:
        raise ValueError(f"unknown runner {spec!r}; known: {', '.join(runner_names())}, or command:'<argv>'") from None
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**options)


__all__ = [
    "DEFAULT_NOW", "Errored", "Outcome", "Raised", "Rendered", "RenderRequest", "Runner", "RunnerUnavailable",
    "Skipped", "cost_hint", "get_runner", "runner_names", "REFERENCE_RUNNER", "BUILTIN_RUNNERS", "EXAMPLE_HARNESSES",
]
