"""EvaluatorRunner: the evaluator behind the runners.base.Runner interface, rendering in-process.

Outcomes map like the HF runner's: every template or input failure is Raised("<ExceptionType>: <message>")
with the type name and message HF reports for the same input; a bound hit (time, output size) is Errored
(timed_out=True for the time limit), because the reference would hang or run out of memory there.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _dist_version

from ..base import Errored, Outcome, Raised, Rendered, RenderRequest, Runner
from .environment import DEFAULT_MAX_OUTPUT, DEFAULT_TIME_LIMIT
from .errors import EvaluatorError, LimitExceeded, RenderTimeout
from .template import ChatTemplate

EVALUATOR_VERSION = "1"


class EvaluatorRunner(Runner):
    name = "evaluator"
    language = "python"
    homepage = ""

    def __init__(self, timeout: float = DEFAULT_TIME_LIMIT, max_output: int = DEFAULT_MAX_OUTPUT, **_options):
        self.timeout = timeout
        self.max_output = max_output
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
            return Raised(exc.reference_text())
        except MemoryError:
            return Errored(f"{request.cell()}: memory exhausted while rendering")
        return Rendered(text)
