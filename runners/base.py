"""The one small interface every engine runner implements.

A runner takes a RenderRequest (a template plus one conversation) and returns exactly one Outcome:

- Rendered(text): the engine produced a prompt.
- Raised(message): the *template* refused (raise_exception, a render-time error the engine reports as
  the template's failure). Comparable with the reference's own refusals.
- Errored(message, detail, timed_out): the *runner* failed (crash, hang, garbage, missing engine).
  Never comparable; never a match.
- Skipped(message): the runner declines the cell on purpose (e.g. a feature it does not implement).

Raised carries its RefusalKind (compile, raise, render): a refusal matches the reference's only when it is of
the same kind (and, for raise_exception, carries the template's message).

Runners never import `conformance`; the suite imports runners.
"""
from __future__ import annotations

import contextlib

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

# The largest template chatgold imports or renders, in UTF-8 bytes: over 5x the largest real chat template
# (45 KB). Bigger ones are refused with a clear error (corpus import, render, the service), which also bounds
# how long a template can take to parse (docs/ARCHITECTURE.md, "Bounds").
MAX_TEMPLATE_BYTES = 256 * 1024

# A fixed default clock so that templates calling strftime_now are reproducible.
DEFAULT_NOW = "2025-06-15T09:30:00+00:00"
# What a cell means: bump when that changes (a conversation field, an outcome kind, a refusal kind), so that
# no outcome recorded under the old meaning is reused (the result store keys every outcome by it).
SEMANTICS_VERSION = 1


def normalize_now(now: str) -> str:
    """The clock as ISO-8601 with an offset: a naive time is read as UTC (what a minimal case may give)."""
    if type(now) is str:
        return _normalize_now(now)  # a harness normalises the same few clocks for every cell
    return _normalize_now.__wrapped__(now)


@lru_cache(maxsize=256)
def _normalize_now(now: str) -> str:
    import datetime as _dt

    try:
        value = _dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        raise ValueError(f"now: {now!r} is not an ISO-8601 date and time") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.isoformat()


@dataclass(frozen=True)
class Conversation:
    """One chat request, as `apply_chat_template` takes it: the part of a case every engine renders.

    The one place these fields are spelled out: cases, render requests, the protocol's messages, test
    vectors and the service all carry a Conversation (schema: runners/protocol/conversation.schema.json)."""

    messages: list
    tools: Optional[list] = None
    documents: Optional[list] = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    now: str = DEFAULT_NOW

    FIELDS = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "kwargs", "now")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Conversation":
        """The conversation fields of `data` (other keys are ignored); absent ones take their defaults."""
        return cls(messages=data["messages"], tools=data.get("tools"), documents=data.get("documents"),
                   add_generation_prompt=bool(data.get("add_generation_prompt", False)),
                   continue_final_message=bool(data.get("continue_final_message", False)),
                   kwargs=dict(data.get("kwargs") or {}), now=normalize_now(data.get("now") or DEFAULT_NOW))

    def to_dict(self) -> dict:
        """Every field, `tools`/`documents` as null when absent (the protocol's and the vectors' form)."""
        return {"messages": self.messages, "tools": self.tools, "documents": self.documents,
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, "kwargs": dict(self.kwargs),
                "now": self.now}


@dataclass(frozen=True)
class RenderRequest:
    """A template (with the model's special tokens) and one conversation: one cell."""

    template: str
    conversation: Conversation
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    # Labels only: runners may use them for caching and messages, never for rendering.
    template_id: Optional[str] = None
    case_id: Optional[str] = None

    # Read-only views of the conversation, so runner code reads `request.messages`.
    messages = property(lambda self: self.conversation.messages)
    tools = property(lambda self: self.conversation.tools)
    documents = property(lambda self: self.conversation.documents)
    add_generation_prompt = property(lambda self: self.conversation.add_generation_prompt)
    continue_final_message = property(lambda self: self.conversation.continue_final_message)
    kwargs = property(lambda self: self.conversation.kwargs)
    now = property(lambda self: self.conversation.now)

    @classmethod
    def make(cls, template: str, messages: list, bos_token: Optional[str] = None, eos_token: Optional[str] = None,
             template_id: Optional[str] = None, case_id: Optional[str] = None, **conversation) -> "RenderRequest":
        """A request from the conversation's fields given directly (tests, probes)."""
        return cls(template, Conversation.from_dict({"messages": messages, **conversation}), bos_token, eos_token,
                   template_id, case_id)

    def to_wire(self) -> dict:
        """The request as the harness protocol's render message body (without cmd/seq)."""
        return {"template": self.template, "bos_token": self.bos_token, "eos_token": self.eos_token,
                **self.conversation.to_dict()}

    def cell(self) -> str:
        return f"{self.template_id or '<template>'} x {self.case_id or '<case>'}"


class RefusalKind(StrEnum):
    """Which kind of refusal a Raised outcome is; two refusals match only when they are of the same kind."""

    COMPILE = "compile"   # the template does not parse or compile in this engine
    RAISE = "raise"       # the template called raise_exception(message)
    RENDER = "render"     # rendering failed on this input (a type error, an undefined value, the caller's check)
    UNKNOWN = "unknown"   # the harness did not say (protocol version 1)
    # The engine declines the template or the request as a whole, whatever the template would do: a format it
    # does not recognise, a feature it does not implement (llama.cpp without --jinja). Never matches a
    # reference refusal, so such a cell is engine-raised (the reference rendered) or raised-differently.
    UNSUPPORTED = "unsupported"


# jinja2's exception types as refusal kinds: a syntax or assertion error is the template failing to compile;
# TemplateError itself is what the template's raise_exception(M) raises (transformers'
# utils/chat_template_utils.py, _compile_jinja_template); every other failure happens while rendering. The
# reference runner names its refusals so, and goldens store them so.
_COMPILE_ERRORS = frozenset({"TemplateSyntaxError", "TemplateAssertionError"})
_RAISE_ERROR = "TemplateError"


def refusal_of(type_name: str) -> RefusalKind:
    """The refusal kind of a jinja2 exception type name."""
    if type_name in _COMPILE_ERRORS:
        return RefusalKind.COMPILE
    return RefusalKind.RAISE if type_name == _RAISE_ERROR else RefusalKind.RENDER


@dataclass(frozen=True)
class Rendered:
    text: str
    kind: str = "rendered"


@dataclass(frozen=True)
class Raised:
    """The template refused: the engine's answer, comparable with the reference's own refusals."""

    message: str
    refusal: RefusalKind = RefusalKind.UNKNOWN
    kind: str = "raised"


@dataclass(frozen=True)
class Errored:
    message: str
    detail: str = ""
    timed_out: bool = False
    kind: str = "errored"


@dataclass(frozen=True)
class Skipped:
    message: str
    kind: str = "skipped"


Outcome = Union[Rendered, Raised, Errored, Skipped]
OUTCOME_TYPES = {"rendered": Rendered, "raised": Raised, "errored": Errored, "skipped": Skipped}


def outcome_to_dict(outcome: Outcome) -> dict:
    """The one JSON form of an outcome (explanations, the explain cache): its kind and its fields, the refusal
    kind as its string."""
    data = dataclasses.asdict(outcome)
    if isinstance(outcome, Raised):
        data["refusal"] = str(outcome.refusal)
    return {"kind": data.pop("kind"), **data}


def outcome_from_dict(data: dict) -> Outcome:
    cls = OUTCOME_TYPES[data["kind"]]
    fields = {k: v for k, v in data.items() if k != "kind"}
    if cls is Raised and "refusal" in fields:
        fields["refusal"] = RefusalKind(fields["refusal"])
    return cls(**fields)


@dataclass(frozen=True)
class FeedRequest:
    """A cell plus what the model's tokenizer says: the input of `Runner.feeds_model_many`."""

    request: RenderRequest
    add_bos_token: bool
    add_eos_token: Optional[bool]  # None: the model states nothing (the engine's own default applies)
    markers: tuple = ()            # texts the vocabulary holds as single special tokens, besides bos/eos


@dataclass(frozen=True)
class Token:
    id: int
    piece: bytes     # the token's bytes
    special: bool    # a special (control) token, as opposed to text


@dataclass(frozen=True)
class Fed:
    """The token sequence an engine feeds its model for a cell, and the text it tokenized."""

    tokens: tuple    # Token, in order
    prompt: str
    kind: str = "fed"


class RunnerUnavailable(RuntimeError):
    """The engine cannot be used on this machine (not built, not installed). Says how to fix it."""


class Runner:
    """Base class. Subclasses set `name` and implement `render`; `version` names the engine build."""

    name: str = "runner"
    # The suite ships this runner, and may ship its baseline; a `command:` harness is the user's own and is
    # never judged against a baseline the suite ships, whatever name it gives itself.
    suite_baseline: bool = True
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

    def identity(self) -> Optional[dict]:
        """Everything this runner's outcome for a cell is a function of, besides the template and the
        conversation (name, engine versions, a digest of the code and configuration in between: see
        runners/identity.py), as JSON data; chatgold may then reuse an outcome recorded under the same identity.
        None (the default): the runner cannot vouch for that, and its outcomes are never reused."""
        return None

    # -- hooks for a cause reducer, which renders thousands of throwaway templates ---------------------------
    @contextlib.contextmanager
    def scratch_space(self, folder: Path, idle: int = 0):
        """While open: files this runner keeps per template go under `folder` (the caller removes it), and a
        runner that starts a process per template keeps up to `idle` of them running between batches (a
        reducer renders many small batches through the same candidate). The default keeps nothing."""
        yield

    def reduction_runner(self) -> Optional["Runner"]:
        """A runner that renders as this one does, cheaper per candidate template (tested against it), for a
        reducer's candidates; every cause is still confirmed on this runner. None: reduce on this runner."""
        return None

    # -- optional queries: an engine that cannot answer keeps these defaults --------------------------------
    def reports_capabilities(self) -> bool:
        """Whether template_capabilities answers (the engine has its own view of what a template supports)."""
        return False

    def template_capabilities(self, template: str, bos_token: Optional[str],
                              eos_token: Optional[str]) -> Optional[dict]:
        """The engine's own view of a template's capabilities (names as in capability goldens, e.g.
        supports_tools: bool), or None when it cannot say. Raises RunnerUnavailable when the engine is gone."""
        return None

    def template_facts(self) -> dict:
        """What the engine decided about each template it rendered, keyed by template id (e.g. llama.cpp's
        built-in format): facts the report shows beside the template. Empty when the engine has none."""
        return {}

    def reports_tokens(self) -> bool:
        """Whether feeds_model_many answers (the runner can tell which tokens the engine feeds its model)."""
        return False

    def feeds_model_many(self, items: Iterable[FeedRequest]) -> Iterator[Union[Fed, Outcome]]:
        """For each item, in order: the tokens the engine would feed its model (Fed), or the outcome that
        stopped it (Raised, Errored, Skipped)."""
        for _ in items:
            yield Skipped(f"{self.name} cannot tell which tokens it feeds the model")

    def reports_template_analysis(self) -> bool:
        """Whether template_analysis answers (the engine analyses how to parse a template's output)."""
        return False

    def template_analysis(self, template: str, bos_token: Optional[str],
                          eos_token: Optional[str]) -> Optional[dict]:
        """The engine's own output-parser analysis of a template: {"fields": {engine's field name: value} or
        None, "specialized": a hand-written handler's name or None, "workarounds": [...], "not_logged": [fields
        the engine never reports]}; None when it cannot say."""
        return None


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
    """SIGKILL a child started with start_new_session=True and its process group, then reap it. Engine
    processes are ended with runners.proctree.kill_tree instead, which also finds descendants that left the
    group (setsid)."""
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
