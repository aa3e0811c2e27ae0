"""EvaluatorRunner: the evaluator behind the runners.base.Runner interface, rendering in harness processes.

Templates are untrusted code, so every render (single renders too: `chatgold render --runner evaluator`) runs in
a harness process (`python -m runners.evaluator.runner`) with an address-space cap (EVALUATOR_MEMORY_LIMIT) and
a time limit per cell (compile limit + render limit + slack; a hang past it kills the process). Inside it, the
evaluator's own bounds (environment.py, bounds.py) answer first with a typed error. With workers > 1,
render_many uses that many processes. `render_in_process` is the same render without the process (the
harness's own renderer; library users who trust their templates).

Outcomes map like the HF runner's: every template or input failure is Raised("<ExceptionType>: <message>")
with the type name and message HF reports for the same input; a bound hit (time, output size, template size)
is Errored (timed_out=True for the time limits), because the reference would hang or run out of memory there.
"""
from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import Iterable, Iterator, Optional

from ..base import (
    Errored,
    Outcome,
    Raised,
    RefusalKind,
    Rendered,
    RenderRequest,
    Runner,
)
from .environment import COMPILE_TIME_LIMIT, DEFAULT_MAX_OUTPUT, DEFAULT_TIME_LIMIT
from .errors import (
    EvaluatorError,
    LimitExceeded,
    RenderTimeout,
    TemplateCompileError,
    TemplateRefusal,
)
from .template import ChatTemplate

EVALUATOR_VERSION = "1"
# Address-space cap of an evaluator harness process: the evaluator's own limits keep a render far below it
# (values of at most 32 Mi characters, 4 Mi items); it catches what they cannot see.
EVALUATOR_MEMORY_LIMIT = 2 * 1024**3


def refusal_kind(exc: EvaluatorError) -> RefusalKind:
    if isinstance(exc, TemplateCompileError):
        return RefusalKind.COMPILE
    return RefusalKind.RAISE if isinstance(exc, TemplateRefusal) else RefusalKind.RENDER


class EvaluatorRunner(Runner):
    name = "evaluator"
    language = "python"
    homepage = ""

    def __init__(self, timeout: float = DEFAULT_TIME_LIMIT, max_output: int = DEFAULT_MAX_OUTPUT, workers: int = 1,
                 memory_limit: int = EVALUATOR_MEMORY_LIMIT, protocol: Optional[int] = None,
                 **_options):
        self.timeout = timeout
        self.max_output = max_output
        self.memory_limit = memory_limit
        self.workers = max(1, workers)
        self.protocol = protocol  # the harness protocol version its worker processes are asked for
        self._isolated = None
        try:
            jinja_version = _dist_version("jinja2")
        except PackageNotFoundError:  # pragma: no cover - jinja2 is a hard dependency
            jinja_version = "missing"
        self.version = f"{EVALUATOR_VERSION} (jinja2 {jinja_version})"

    def render(self, request: RenderRequest) -> Outcome:
        return self._harness().render(request)

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        yield from self._harness().render_many(requests)

    def _harness(self):
        if self._isolated is None:
            from ..command import CommandRunner
            from ..harness import python_harness

            argv, env = python_harness("runners.evaluator.runner")
            argv += ["--timeout", repr(self.timeout), "--max-output", str(self.max_output),
                     "--memory-limit", str(self.memory_limit)]
            # The process timeout only backs up the evaluator's own limits (compile, then render), which
            # report first.
            self._isolated = CommandRunner(argv, name=self.name, workers=self.workers,
                                           timeout=COMPILE_TIME_LIMIT + self.timeout + 10, env=env,
                                           **({"protocol": self.protocol} if self.protocol else {}))
        return self._isolated

    def render_in_process(self, request: RenderRequest) -> Outcome:
        """The render itself, in this process: what the harness process runs for each cell."""
        try:
            text = ChatTemplate(request.template).render(
                request.messages, tools=request.tools, documents=request.documents,
                add_generation_prompt=request.add_generation_prompt, bos_token=request.bos_token,
                eos_token=request.eos_token, kwargs=dict(request.kwargs), now=request.now,
                continue_final_message=request.continue_final_message,
                time_limit=self.timeout, max_output=self.max_output)
        except RenderTimeout as exc:
            return Errored(f"{request.cell()}: {exc}", timed_out=True)
        except LimitExceeded as exc:
            return Errored(f"{request.cell()}: {exc}")
        except EvaluatorError as exc:
            return Raised(exc.reference_text(), refusal_kind(exc))
        except MemoryError:
            return Errored(f"{request.cell()}: memory exhausted while rendering")
        except RecursionError as exc:  # input nested past Python's stack, before the template ran: as in HF
            return Raised(f"RecursionError: {exc}", RefusalKind.RENDER)
        return Rendered(text)

    def identity(self) -> dict:
        from ..identity import python_runner_identity

        # In-process or in harness processes, the same code renders: the package, the protocol, jinja2 (its
        # parser) and markupsafe.
        return python_runner_identity(self.name, ["evaluator"], ["jinja2", "markupsafe"], evaluator=EVALUATOR_VERSION)

    def close(self) -> None:
        if self._isolated is not None:
            self._isolated.close()
            self._isolated = None


def main(argv=None) -> None:
    from ..harness import serve

    parser = argparse.ArgumentParser(prog="python -m runners.evaluator.runner")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIME_LIMIT)
    parser.add_argument("--max-output", type=int, default=DEFAULT_MAX_OUTPUT)
    parser.add_argument("--memory-limit", type=int, default=EVALUATOR_MEMORY_LIMIT)
    args = parser.parse_args(argv)
    runner = EvaluatorRunner(timeout=args.timeout, max_output=args.max_output)
    serve({"name": runner.name, "version": runner.version, "language": runner.language,
           "homepage": runner.homepage}, runner.render_in_process, memory_limit=args.memory_limit)


if __name__ == "__main__":
    main()
