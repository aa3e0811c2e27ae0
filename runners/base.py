"""The one small interface every engine runner implements.

A runner takes a RenderRequest (a template plus one conversation) and returns exactly one Outcome:

- Rendered(text): the engine produced a prompt.
- Raised(message): the *template* refused (raise_exception, a render-time error the engine reports as
  the template's failure). Comparable with the reference's own refusals.
- Errored(message, detail, timed_out): the *runner* failed (crash, hang, garbage, missing engine).
  Never comparable; never a match.
- Skipped(reason): the runner declines the cell on purpose (e.g. a feature it does not implement).

Runners never import `conformance`; the suite imports runners.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

# A fixed default clock so that templates calling strftime_now are reproducible.
DEFAULT_NOW = "2025-06-15T09:30:00+00:00"


@dataclass(frozen=True)
class RenderRequest:
    template: str
    messages: list
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    tools: Optional[list] = None
    documents: Optional[list] = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    now: str = DEFAULT_NOW
    # Labels only: runners may use them for caching and messages, never for rendering.
    template_id: Optional[str] = None
    case_id: Optional[str] = None

    def to_wire(self) -> dict:
        """The request as the harness protocol's render message body (without cmd/seq)."""
        return {
            "template": self.template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "messages": self.messages,
            "tools": self.tools,
            "documents": self.documents,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "kwargs": dict(self.kwargs),
            "now": self.now,
        }

    def cell(self) -> str:
        return f"{self.template_id or '<template>'} x {self.case_id or '<case>'}"


@dataclass(frozen=True)
class Rendered:
    text: str
    kind: str = "rendered"


@dataclass(frozen=True)
class Raised:
    message: str
    kind: str = "raised"


@dataclass(frozen=True)
class Errored:
    message: str
    detail: str = ""
    timed_out: bool = False
    kind: str = "errored"


@dataclass(frozen=True)
class Skipped:
    reason: str
    kind: str = "skipped"


Outcome = Union[Rendered, Raised, Errored, Skipped]


def outcome_to_dict(outcome: Outcome) -> dict:
    return dataclasses.asdict(outcome)


def outcome_from_dict(data: dict) -> Outcome:
    kinds = {"rendered": Rendered, "raised": Raised, "errored": Errored, "skipped": Skipped}
    cls = kinds[data["kind"]]
    return cls(**{k: v for k, v in data.items() if k != "kind"})


class RunnerUnavailable(RuntimeError):
    """The engine cannot be used on this machine (not built, not installed). Says how to fix it."""


class Runner:
    """Base class. Subclasses set `name` and implement `render`; `version` names the engine build."""

    name: str = "runner"
    version: str = "unknown"
    language: str = "python"
    homepage: str = ""
    # Rough time per cell relative to an in-process Jinja engine; a batch scheduler starts the slowest first.
    cost_hint: float = 1.0

    def render(self, request: RenderRequest) -> Outcome:  # pragma: no cover - interface
        raise NotImplementedError

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        """Render a batch, yielding outcomes in request order. Override to batch or parallelise."""
        for request in requests:
            yield self.render(request)

    def close(self) -> None:
        """Release processes and files. Safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "language": self.language, "homepage": self.homepage}


def describe_exit(returncode: Optional[int]) -> str:
    """A process's exit status in words: still running, exit code N, or the signal that killed it."""
    import signal

    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def kill_process_group(proc) -> None:
    """SIGKILL a child started with start_new_session=True and everything it spawned, then reap it."""
    import os
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()


def canonical_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
