"""EvaluatorRunner: the evaluator behind the runners.base.Runner interface, rendering in-process.

With workers > 1, render_many renders in that many harness processes (`python -m runners.evaluator.runner`)
instead: a batch then uses every core, and the caller's interpreter stays free for its own work (the gate
compares and reports while engines render). Single renders stay in-process.

Outcomes map like the HF runner's: every template or input failure is Raised("<ExceptionType>: <message>")
with the type name and message HF reports for the same input; a bound hit (time, output size) is Errored
(timed_out=True for the time limit), because the reference would hang or run out of memory there.
"""
from __future__ import annotations

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
from .environment import DEFAULT_MAX_OUTPUT, DEFAULT_TIME_LIMIT
from .errors import (
    EvaluatorError,
    LimitExceeded,
    RenderTimeout,
    TemplateCompileError,
    TemplateRefusal,
)
from .template import ChatTemplate

EVALUATOR_VERSION = "1"


def refusal_kind(exc: EvaluatorError) -> RefusalKind:
    if isinstance(exc, TemplateCompileError):
        return RefusalKind.COMPILE
    return RefusalKind.RAISE if isinstance(exc, TemplateRefusal) else RefusalKind.RENDER


class EvaluatorRunner(Runner):
    name = "evaluator"
    language = "python"
    homepage = ""

    def __init__(self, timeout: float = DEFAULT_TIME_LIMIT, max_output: int = DEFAULT_MAX_OUTPUT, workers: int = 1,
                 protocol: Optional[int] = None, **_options):
        self.timeout = timeout
        self.max_output = max_output
        self.workers = max(1, workers)
        self.protocol = protocol  # the harness protocol version its worker processes are asked for
        self._isolated = None
        try:
            jinja_version = _dist_version("jinja2")
        except PackageNotFoundError:  # pragma: no cover - jinja2 is a hard dependency
            jinja_version = "missing"
        self.version = f"{EVALUATOR_VERSION} (jinja2 {jinja_version})"

    def render(self, request: RenderRequest) -> Outcome:
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
        return Rendered(text)

    def identity(self) -> dict:
        from ..identity import python_runner_identity

        # In-process or in harness processes, the same code renders: the package, the protocol, jinja2 (its
        # parser) and markupsafe.
        return python_runner_identity(self.name, ["evaluator"], ["jinja2", "markupsafe"], evaluator=EVALUATOR_VERSION)

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        if self.workers == 1:
            yield from super().render_many(requests)
            return
        if self._isolated is None:
            from ..command import CommandRunner
            from ..harness import python_harness

            argv, env = python_harness("runners.evaluator.runner")
            # The process timeout only backs up the evaluator's own time bound, which reports first.
            extra = {"protocol": self.protocol} if self.protocol else {}
            self._isolated = CommandRunner(argv, name=self.name, workers=self.workers, timeout=self.timeout + 10,
                                           env=env, **extra)
        yield from self._isolated.render_many(requests)

    def close(self) -> None:
        if self._isolated is not None:
            self._isolated.close()
            self._isolated = None


def main() -> None:
    from ..harness import serve

    runner = EvaluatorRunner()
    serve({"name": runner.name, "version": runner.version, "language": runner.language,
           "homepage": runner.homepage}, runner.render)


if __name__ == "__main__":
    main()
