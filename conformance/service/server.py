"""The golden-file service: corpus, cases and goldens over HTTP, plus checking and reference renders.

Engine authors in any language fetch goldens and check cells without Python. The OpenAPI document at
/openapi.json is the contract (docs/service.md). Every id reaches the filesystem only after it was found in
the loaded corpus or case set, so no request can name a path outside goldens/.

No template code runs in this process: new goldens render in the reference's harness process and attribution
in an attribution worker process, each through a bounded fail-fast pool (workers.py) outside the request
threads. Every error body is JSON ({"detail": ...}), whatever the request held, malformed HTTP included.
"""
from __future__ import annotations

import asyncio
import fnmatch
import functools
import hmac
import importlib
import json
import re
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Optional

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from conformance.corpus.cases import Case, load_cases
from conformance.corpus.manifest import (
    Corpus,
    TemplateEntry,
    load_corpus,
    sha256_text,
    templates_dir,
)
from conformance.judge.goldens import ENCODING_ERRORS, read_golden, read_meta
from conformance.judge.status import STATUSES, result_for
from conformance.service.workers import Busy, RateLimiter, WorkPool
from runners.base import MAX_TEMPLATE_BYTES, Raised, RefusalKind, Rendered

API_VERSION = "1"
# Documented limits (docs/service.md). Bodies beyond MAX_BODY_BYTES get 413 before they are parsed.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
MAX_BATCH_CELLS = 1000
GOLDENS_CELL_SECONDS = 10.0
GOLDENS_TOTAL_SECONDS = 120.0
# The expensive pools (workers.py): worker processes, and how many jobs may wait before the next is refused.
GOLDENS_WORKERS = 1
GOLDENS_QUEUE = 4
ATTRIBUTION_WORKERS = 1
ATTRIBUTION_QUEUE = 8
WORKER_NICE = 19  # the lowest priority: worker processes yield the CPU to the server's own request handling
# Beyond loopback: a token is required and each client address gets DEFAULT_RATE requests/s (bursts of 2x).
DEFAULT_RATE = 20.0
TOKEN_ENV = "CHATGOLD_SERVICE_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,199}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_ID_RE = re.compile(ID_PATTERN)


class _JSON(JSONResponse):
    """JSON that survives lone surrogates (goldens keep them byte-exact): escape them instead of failing."""

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


# --- models -------------------------------------------------------------------------------------------------

class ErrorBody(BaseModel):
    detail: str = Field(description="What was wrong with the request")


class TemplateSummary(BaseModel):
    id: str
    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the template's exact UTF-8 bytes")
    family: str
    variant: str
    generic: bool
    bos_token: Optional[str]
    eos_token: Optional[str]
    aliases: list[str] = Field(description="Model repositories this template ships with")
    constructs: Optional[list[str]] = Field(
        None, description="Jinja constructs the template uses; null when not requested or unavailable")
    capabilities: Optional[dict[str, Any]] = Field(
        None, description="The template's capability golden; null when none is recorded or unavailable")
    notes: list[str] = Field(default_factory=list, description="Why constructs/capabilities are missing")


class TemplateDetail(TemplateSummary):
    source: str = Field(description="The template text, exactly")


class TemplateList(BaseModel):
    count: int
    templates: list[TemplateSummary]


class CaseInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    description: str
    features: list[str]
    messages: list[Any]
    add_generation_prompt: bool
    continue_final_message: bool
    kwargs: dict[str, Any]
    now: str
    tools: Optional[list[Any]] = None
    documents: Optional[list[Any]] = None
    sequence: Optional[dict[str, Any]] = None


class CaseList(BaseModel):
    count: int
    cases: list[CaseInput]


class GoldenJSON(BaseModel):
    template: str
    case: str
    kind: Literal["rendered", "raised"] = Field(
        description="rendered: `text` is the expected output; raised: the reference refused and `text` is its message")
    text: str
    bytes: int = Field(description="Length of the golden in UTF-8 bytes")


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["output"]}, {"required": ["raised"]}]})
    template: str = Field(max_length=200, description="Corpus template id")
    case: str = Field(max_length=200, description="Case id")
    output: Optional[str] = Field(None, max_length=MAX_OUTPUT_CHARS, description="What the engine rendered")
    raised: Optional[str] = Field(None, max_length=MAX_OUTPUT_CHARS,
                                  description="The engine refused to render, with this message")
    refusal: Optional[Literal["compile", "raise", "render", "unsupported"]] = Field(
        None, description="Which kind of refusal `raised` is (compile: the template does not compile; raise: it "
                          "called raise_exception; render: rendering failed; unsupported: the engine declines "
                          "the template or request as a whole, which never matches). Absent: unknown, and only a "
                          "raise_exception message can then match")

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.output is None) == (self.raised is None):
            raise ValueError("give exactly one of `output` (the engine rendered) or `raised` (the engine refused)")
        return self


class DivergenceModel(BaseModel):
    offset: int = Field(description="First differing byte offset (UTF-8) in the golden")
    expected_len: int
    actual_len: int
    expected_context: str = Field(description="The golden around the offset, whitespace made visible; ⟦ marks it")
    actual_context: str = Field(description="The output around the offset, same notation")
    line: int = Field(description="1-based line of the offset in the golden")
    column: int


class Attribution(BaseModel):
    # "construct" would shadow BaseModel.construct: keep the wire name through an alias.
    model_config = ConfigDict(populate_by_name=True)
    line: Optional[int] = Field(None, description="1-based template line that emitted the golden's byte")
    construct_name: Optional[str] = Field(None, alias="construct", description="The Jinja construct that emitted it")
    source_line: Optional[str] = None
    at_golden_end: Optional[bool] = None
    unavailable: Optional[str] = Field(None, description="Why no line could be attributed")


class CheckResult(BaseModel):
    template: str
    case: str
    status: Literal[tuple(str(s) for s in STATUSES)]  # type: ignore[valid-type]
    passed: bool
    golden_kind: Optional[Literal["rendered", "raised"]]
    divergence: Optional[DivergenceModel] = None
    reference_message: Optional[str] = Field(None, description="The reference's refusal, when it refused")
    reference_refusal: Optional[Literal["compile", "raise", "render"]] = Field(
        None, description="The kind of the reference's refusal, when it refused")
    note: Optional[str] = Field(None, description="Why two refusals do not match, when they do not")
    attribution: Optional[Attribution] = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cells: list[CheckRequest] = Field(max_length=MAX_BATCH_CELLS, min_length=1)
    attribute: bool = Field(False, description="Attribute divergences to template lines (slower)")


class BatchSummary(BaseModel):
    cells: int
    judged: int = Field(description="Cells inside the conformance denominator (the engine ran them, a golden exists)")
    passed: int
    not_run: int
    counts: dict[str, int]
    conformance: Optional[float] = Field(description="passed / judged, percent")
    ran: Optional[float] = Field(description="judged / cells, percent")


class BatchResult(BaseModel):
    results: list[CheckResult]
    summary: BatchSummary


class GoldensRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    template: str = Field(max_length=MAX_TEMPLATE_BYTES, description=f"Template text (at most {MAX_TEMPLATE_BYTES} bytes)")
    bos_token: Optional[str] = Field(None, max_length=1000)
    eos_token: Optional[str] = Field(None, max_length=1000)
    cases: Optional[list[str]] = Field(None, max_length=200,
                                       description="Case id globs; all cases when omitted")


class NewGolden(BaseModel):
    case: str
    kind: Literal["rendered", "raised", "errored", "not-run"] = Field(
        description="errored: the reference process failed or ran out of time; not-run: the overall time ran out")
    text: str


class GoldensResult(BaseModel):
    sha256: str
    corpus_id: Optional[str] = Field(description="The corpus template with the same bytes, if any")
    reference: dict[str, str]
    complete: bool
    goldens: list[NewGolden]


class IdentifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["template"]}, {"required": ["sha256"]}]})
    template: Optional[str] = Field(None, max_length=MAX_TEMPLATE_BYTES * 4)
    sha256: Optional[str] = Field(None, pattern=SHA256_PATTERN)

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.template is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `template` (the text) or `sha256` (lowercase hex)")
        return self


class IdentifyResult(BaseModel):
    sha256: str
    matched: bool
    template: Optional[TemplateSummary] = None
    hint: Optional[str] = None


# --- state --------------------------------------------------------------------------------------------------

class State:
    """Everything loaded once per server process; the reference runner starts on first use and stays warm."""

    def __init__(self, corpus: Optional[Corpus] = None, cases: Optional[list[Case]] = None):
        self.corpus = corpus or load_corpus()
        self.cases = {c.id: c for c in (cases if cases is not None else load_cases())}
        self.reference = {k: str(v) for k, v in read_meta().items()}
        self.goldens_pool = WorkPool("reference", _reference_runner, GOLDENS_WORKERS, GOLDENS_QUEUE,
                                     retry_after=int(GOLDENS_TOTAL_SECONDS // 4))
        self.attribution_pool = WorkPool("attribution", _attribution_worker, ATTRIBUTION_WORKERS,
                                         ATTRIBUTION_QUEUE, retry_after=5)
        # Reference outcomes already rendered for the same transformers, template and case (judge/store.py).
        from conformance.judge.store import ResultStore

        self.store = ResultStore()

    def template(self, template_id: str) -> TemplateEntry:
        if not _ID_RE.match(template_id):
            raise HTTPException(400, f"invalid template id {template_id!r}: ids match {ID_PATTERN}")
        entry = self.corpus.by_id.get(template_id)
        if entry is None:
            raise HTTPException(404, f"unknown template id {template_id!r} (GET /v1/templates lists them)")
        return entry

    def case(self, case_id: str) -> Case:
        if not _ID_RE.match(case_id):
            raise HTTPException(400, f"invalid case id {case_id!r}: ids match {ID_PATTERN}")
        case = self.cases.get(case_id)
        if case is None:
            raise HTTPException(404, f"unknown case id {case_id!r} (GET /v1/cases lists them)")
        return case

    def close(self) -> None:
        self.goldens_pool.close()
        self.attribution_pool.close()


def _reference_runner():
    from runners.hf import HFRunner

    return HFRunner(timeout=GOLDENS_CELL_SECONDS, nice=WORKER_NICE)


def _attribution_worker():
    from conformance.judge.attribution import AttributionWorker

    return AttributionWorker(nice=WORKER_NICE)


@functools.lru_cache(maxsize=4)
def _construct_table(root: str) -> dict:
    from conformance.corpus.manifest import load_constructs

    return load_constructs(Path(root))


def _constructs(entry: TemplateEntry, notes: list) -> Optional[list[str]]:
    names = _construct_table(str(entry.root or templates_dir())).get(entry.sha256)
    if names is None:
        notes.append("constructs unavailable: not recorded in templates/constructs.json (run `chatgold corpus build`)")
    return names


def _capabilities(entry: TemplateEntry, notes: list) -> Optional[dict]:
    try:
        module = importlib.import_module("conformance.analysis.capabilities")
        load = getattr(module, "load_capabilities")
    except Exception as exc:
        notes.append(f"capabilities unavailable: conformance.analysis.capabilities.load_capabilities missing ({exc})")
        return None
    try:
        found = load(entry.id)
    except Exception as exc:
        notes.append(f"capabilities unavailable: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    return dict(found) if found else None


def summary_of(entry: TemplateEntry, detail: bool) -> dict:
    notes: list = []
    data = {"id": entry.id, "sha256": entry.sha256, "family": entry.family, "variant": entry.variant,
            "generic": entry.generic, "bos_token": entry.bos_token, "eos_token": entry.eos_token,
            "aliases": entry.aliases(), "constructs": None, "capabilities": None, "notes": notes}
    if detail:
        data["constructs"] = _constructs(entry, notes)
        data["capabilities"] = _capabilities(entry, notes)
    return data


def check_one(state: State, cell: CheckRequest) -> dict:
    """Classify one cell (a file read and a byte compare); attribution is added by the caller, through the
    attribution pool."""
    entry = state.template(cell.template)
    case = state.case(cell.case)
    golden = read_golden(entry.id, case.id)
    if cell.output is not None:
        outcome = Rendered(cell.output)
    else:
        outcome = Raised(cell.raised, RefusalKind(cell.refusal) if cell.refusal else RefusalKind.UNKNOWN)
    judged = result_for("service", entry.id, case.id, golden, outcome)
    result = {"template": entry.id, "case": case.id, "status": str(judged.status), "passed": judged.passed,
              "golden_kind": golden.kind if golden else None,
              "divergence": judged.divergence.to_dict() if judged.divergence else None,
              "reference_message": judged.reference_message, "reference_refusal": judged.reference_refusal,
              "note": judged.extra.get("note"), "attribution": None}
    return result


async def attribute(state: State, results: list) -> None:
    """Attribute every diverged result in the attribution pool (one task per template); a full pool leaves them
    {"unavailable": ...} saying so rather than making the caller wait."""
    tasks: dict = {}  # template id -> (entry, cells)
    places = []       # (result, template id, index of its cell in the task)
    for result in results:
        if result["divergence"] is None:
            continue
        entry, case = state.corpus.by_id[result["template"]], state.cases[result["case"]]
        cells = tasks.setdefault(entry.id, (entry, []))[1]
        places.append((result, entry.id, len(cells)))
        cells.append((case.request("", entry.bos_token, entry.eos_token, template_id=entry.id),
                      read_golden(entry.id, case.id), [result["divergence"]["offset"]]))
    if not places:
        return
    jobs: dict = {}
    try:
        for template_id, (entry, cells) in tasks.items():
            jobs[template_id] = state.attribution_pool.submit(
                functools.partial(_run_attribution, (entry.source(), cells)))
    except Busy as exc:
        for future in jobs.values():
            future.cancel()
        for result, _, _ in places:
            result["attribution"] = {"unavailable": f"attribution unavailable: {exc}"}
        return
    answers = {template_id: await asyncio.wrap_future(future) for template_id, future in jobs.items()}
    for result, template_id, index in places:
        result["attribution"] = answers[template_id][index][0]


def _run_attribution(task, worker) -> list:
    return worker.run(task)


# --- app ----------------------------------------------------------------------------------------------------

_ERRORS = {400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 413: {"model": ErrorBody},
           422: {"model": ErrorBody, "description": "Malformed JSON, wrong types or values (FastAPI's list of "
                                                    "problems in `detail`)"}}
_BUSY = {503: {"model": ErrorBody, "description": "The reference is busy; retry after Retry-After seconds"}}


class Guard:
    """In front of everything, before a body is read: the token and the per-client rate limit (when set), and
    the fail-fast answer for POST /v1/goldens when the reference's queue is full (503, Retry-After) so a flood
    of them costs no parsing."""

    def __init__(self, app, token: Optional[str], limiter: Optional[RateLimiter], state_of):
        self.app = app
        self.token = token.encode() if token else None
        self.limiter = limiter
        self.state_of = state_of

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if self.token is not None and path.startswith("/v1/"):
            supplied = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    supplied = value[7:].strip()
            if not hmac.compare_digest(supplied, self.token):
                return await _send_error(send, 401, "a bearer token is required (Authorization: Bearer <token>)",
                                         [(b"www-authenticate", b"Bearer")])
        if self.limiter is not None:
            client = (scope.get("client") or ("unknown", 0))[0]
            wait = self.limiter.allow(client)
            if wait:
                return await _send_error(send, 429, f"rate limit of {self.limiter.rate:g} requests/s per client "
                                                    f"exceeded; retry after {wait:.1f} s",
                                         [(b"retry-after", RateLimiter.retry_after(wait).encode())])
        if scope.get("method") == "POST" and path == "/v1/goldens":
            pool = self.state_of().goldens_pool
            if pool.full():
                busy = Busy(pool.name, pool.retry_after)
                return await _send_error(send, 503, str(busy), [(b"retry-after", str(busy.retry_after).encode())])
        return await self.app(scope, receive, send)


class BodyLimit:
    """Refuse bodies over MAX_BODY_BYTES with 413, whether declared (Content-Length) or streamed."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = f"request body exceeds the service's limit of {self.limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await _send_error(send, 400, "invalid Content-Length header")
                if declared > self.limit:
                    return await _send_error(send, 413, message)
        # Read the whole (bounded) body first: an exception raised mid-read would be turned into a 400
        # by the framework's body parser, hiding the real reason.
        chunks, seen = [], 0
        while True:
            event = await receive()
            if event["type"] != "http.request":
                return await self.app(scope, _replay([event]), send)
            seen += len(event.get("body", b""))
            if seen > self.limit:
                return await _send_error(send, 413, message)
            chunks.append(event.get("body", b""))
            if not event.get("more_body", False):
                break
        await self.app(scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}],
                                      receive), send)


def _replay(events: list, then=None):
    async def receive():
        if events:
            return events.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}
    return receive


async def _send_error(send, status: int, detail: str, headers: Optional[list] = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _clip(value: Any, limit: int = 200) -> Any:
    """The input a validation error echoes, cut short: a body of megabytes is not sent back (or copied)."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"... ({len(value)} characters)"
    if isinstance(value, (list, dict)):
        try:
            size = len(json.dumps(value, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            size = limit + 1
        if size > limit:
            return f"<{type(value).__name__} of {len(value)} items, {size} characters of JSON>"
    return value


def _install_error_handlers(app: FastAPI) -> None:
    """Every error answer is JSON, whatever the request held: FastAPI's own handlers echo the input in a plain
    JSONResponse, which fails (500, text) on a lone surrogate; and a body that is not JSON at all (bad UTF-8,
    nested past the parser's depth) is a 422 as documented, not FastAPI's 400."""

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        errors = [{**error, "input": _clip(error["input"])} if "input" in error else error for error in exc.errors()]
        return _JSON({"detail": jsonable_encoder(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        cause = exc.__cause__
        if exc.status_code == 400 and cause is not None and not isinstance(cause, StarletteHTTPException):
            why = ("it nests too deeply" if isinstance(cause, RecursionError)
                   else f"{type(cause).__name__}: {str(cause)[:200]}")
            return _JSON({"detail": f"the request body is not valid JSON: {why}"}, status_code=422)
        return _JSON({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        return _JSON({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)


def create_app(state: Optional[State] = None, token: Optional[str] = None,
               rate_limit: Optional[float] = None) -> FastAPI:
    """The app. `token`: required as `Authorization: Bearer <token>` on /v1/*; `rate_limit`: requests/s per
    client address (`chatgold serve` sets both when it binds beyond loopback)."""
    holder: dict = {"state": state}

    @asynccontextmanager
    async def lifespan(app):
        if holder["state"] is None:
            holder["state"] = State()
        listings[((), False)] = await run_in_threadpool(build_listing, (), False)
        yield
        holder["state"].close()

    def st() -> State:
        if holder["state"] is None:
            holder["state"] = State()
        return holder["state"]

    app = FastAPI(title="chatgold golden-file service", version=API_VERSION, lifespan=lifespan,
                  default_response_class=_JSON, openapi_url="/openapi.json",
                  description="Goldens are the byte-exact output of HuggingFace transformers' "
                              "apply_chat_template. Fetch them, check an engine's output against them, "
                              "or have the reference render a new template.")

    listings: dict = {}  # (id globs, detail) -> encoded body: the corpus does not change while the service runs

    def build_listing(patterns: tuple, detail: bool) -> bytes:
        entries = st().corpus.select(list(patterns) or None)
        data = TemplateList.model_validate({"count": len(entries), "templates": [summary_of(e, detail)
                                                                                 for e in entries]})
        return _JSON(None).render(data.model_dump(mode="json"))

    # Built once per selection (in a thread), then served from memory on the event loop: no thread hop, so the
    # listing keeps its latency however busy the request threads are.
    @app.get("/v1/templates", response_model=TemplateList, tags=["read"])
    async def list_templates(template: Optional[list[str]] = Query(None, max_length=50, description="id globs"),
                             detail: bool = Query(False, description="include constructs and capabilities (slow)")):
        key = (tuple(template or ()), detail)
        body = listings.get(key)
        if body is None:
            body = await run_in_threadpool(build_listing, *key)
            if len(listings) < 64:
                listings[key] = body
        return Response(body, media_type="application/json")

    @app.get("/v1/templates/{template_id}", response_model=TemplateDetail, responses=_ERRORS, tags=["read"])
    def get_template(template_id: str):
        entry = st().template(template_id)
        return {**summary_of(entry, True), "source": entry.source()}

    # A case as its file has it: absent tools/documents stay absent (the reference binds them to none either way,
    # runners/protocol/SEMANTICS.md R7, R8).
    @app.get("/v1/cases", response_model=CaseList, response_model_exclude_unset=True, tags=["read"])
    def list_cases(case: Optional[list[str]] = Query(None, max_length=50, description="id globs")):
        cases = [c for c in st().cases.values() if not case or any(fnmatch.fnmatchcase(c.id, p) for p in case)]
        return {"count": len(cases), "cases": [c.to_dict() for c in cases]}

    @app.get("/v1/cases/{case_id}", response_model=CaseInput, response_model_exclude_unset=True, responses=_ERRORS,
             tags=["read"])
    def get_case(case_id: str):
        return st().case(case_id).to_dict()

    @app.get("/v1/goldens/{template_id}/{case_id}", tags=["read"],
             response_class=Response,
             responses={**_ERRORS, 200: {
                 "model": GoldenJSON,
                 "description": "The golden's exact bytes (text/plain) or, with Accept: application/json, "
                                "a GoldenJSON. Header X-Chatgold-Outcome says rendered or raised.",
                 "content": {"text/plain": {"schema": {"type": "string"}}},
                 "headers": {"X-Chatgold-Outcome": {"schema": {"type": "string", "enum": ["rendered", "raised"]}}}}})
    async def get_golden(template_id: str, case_id: str, request: Request):
        state = st()
        entry, case = state.template(template_id), state.case(case_id)
        golden = read_golden(entry.id, case.id)
        if golden is None:
            raise HTTPException(404, f"no golden for {entry.id}/{case.id} (run `chatgold goldens update`)")
        headers = {"X-Chatgold-Outcome": golden.kind}
        if "application/json" in request.headers.get("accept", ""):
            body = GoldenJSON(template=entry.id, case=case.id, kind=golden.kind, text=golden.text,
                              bytes=len(golden.data))
            return _JSON(body.model_dump(), headers=headers)
        return Response(golden.data, media_type="text/plain; charset=utf-8", headers=headers)

    @app.post("/v1/check", response_model=CheckResult, responses=_ERRORS, tags=["check"])
    async def check(cell: CheckRequest,
                    attribute_divergence: bool = Query(True, alias="attribute",
                                                       description="attribute a divergence to a template line")):
        # Classifying is a file read and a byte compare: done on the event loop (a thread hop costs more).
        # Attribution re-renders the template: in the attribution pool, never here.
        result = check_one(st(), cell)
        if attribute_divergence:
            await attribute(st(), [result])
        return result

    @app.post("/v1/check/batch", response_model=BatchResult, responses=_ERRORS, tags=["check"])
    async def check_batch(batch: BatchRequest):
        state = st()
        results = await run_in_threadpool(_classify_batch, state, batch.cells)
        if batch.attribute:
            await attribute(state, results)
        from conformance.judge.pipeline import summary_of

        return {"results": results, "summary": summary_of(results)}

    def _classify_batch(state: State, cells: list) -> list:
        results = []
        for index, cell in enumerate(cells):
            try:
                results.append(check_one(state, cell))
            except HTTPException as exc:
                raise HTTPException(exc.status_code, f"cells[{index}]: {exc.detail}") from None
        return results

    @app.post("/v1/goldens", response_model=GoldensResult, responses={**_ERRORS, **_BUSY}, tags=["reference"])
    async def new_goldens(body: GoldensRequest):
        state = st()
        data = body.template.encode("utf-8", ENCODING_ERRORS)
        if len(data) > MAX_TEMPLATE_BYTES:
            raise HTTPException(413, f"template is {len(data)} bytes; the limit is {MAX_TEMPLATE_BYTES}")
        cases = [c for c in state.cases.values()
                 if not body.cases or any(fnmatch.fnmatchcase(c.id, p) for p in body.cases)]
        if not cases:
            raise HTTPException(400, f"no case matches {body.cases!r} (GET /v1/cases lists them)")
        try:
            future = state.goldens_pool.submit(functools.partial(_render_goldens, state, body, cases))
        except Busy as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # the server is shutting down under this request
            future.cancel()
            raise HTTPException(503, "the service is shutting down; retry later", headers={"Retry-After": "30"}) \
                from None

    def _render_goldens(state: State, body: GoldensRequest, cases: list, runner) -> dict:
        data = body.template.encode("utf-8", ENCODING_ERRORS)
        runner.retry_starts()  # a reference that failed to start for an earlier request gets another chance
        deadline = time.monotonic() + GOLDENS_TOTAL_SECONDS
        goldens, complete = [], True
        requests = [case.request(body.template, body.bos_token, body.eos_token, template_id="<posted>")
                    for case in cases]
        # The store answers first; only the cells it does not hold cost reference renders (and the deadline).
        identity = state.store.identity_of(runner)
        known = state.store.lookup(identity[0], requests) if identity else [None] * len(requests)
        fresh: list = []
        for case, request, outcome in zip(cases, requests, known):
            if outcome is None:
                if time.monotonic() > deadline:
                    complete = False
                    goldens.append({"case": case.id, "kind": "not-run",
                                    "text": f"overall limit of {GOLDENS_TOTAL_SECONDS:.0f} s reached"})
                    continue
                outcome = runner.render(request)
                fresh.append((request, outcome))
            if isinstance(outcome, Rendered):
                goldens.append({"case": case.id, "kind": "rendered", "text": outcome.text})
            elif isinstance(outcome, Raised):
                goldens.append({"case": case.id, "kind": "raised", "text": outcome.message})
            else:
                complete = False
                why = outcome.message
                goldens.append({"case": case.id, "kind": "errored", "text": why})
        if identity and fresh:
            state.store.record(identity, [r for r, _ in fresh], [o for _, o in fresh])
        sha = sha256_text(data)
        match = state.corpus.by_sha.get(sha)
        return {"sha256": sha, "corpus_id": match.id if match else None, "reference": state.reference,
                "complete": complete, "goldens": goldens}

    @app.post("/v1/identify", response_model=IdentifyResult, responses=_ERRORS, tags=["read"])
    def identify(body: IdentifyRequest):
        state = st()
        sha = body.sha256 or sha256_text(body.template.encode("utf-8", ENCODING_ERRORS))
        entry = state.corpus.by_sha.get(sha)
        if entry is None:
            return {"sha256": sha, "matched": False, "template": None,
                    "hint": "not in the corpus: save the template to a file and run `chatgold corpus import <path>`"}
        return {"sha256": sha, "matched": True, "template": summary_of(entry, False)}

    _install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(Guard, token=token, limiter=RateLimiter(rate_limit) if rate_limit else None, state_of=st)
    return app


def _json_400_protocol():
    """uvicorn's HTTP protocol class, answering a malformed request (bad request line or headers, which never
    reach the app) with a JSON body instead of plain text."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools is optional for uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    class JSON400(Base):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"detail": f"malformed HTTP request: {msg}"}).encode()
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + body)
            self.transport.close()

    return JSON400


def serve(host: str = "127.0.0.1", port: int = 8765, ready_file: Optional[str] = None, token: Optional[str] = None,
          rate_limit: Optional[float] = None) -> None:
    """Run the service until interrupted. `ready_file` receives the bound port (useful with port 0). Beyond
    loopback a token is required and a rate limit applies (DEFAULT_RATE unless given)."""
    import uvicorn

    if host not in LOOPBACK_HOSTS:
        if not token:
            raise ValueError(f"binding {host} makes the service reachable beyond this machine: give a token "
                             f"(--token or {TOKEN_ENV})")
        rate_limit = rate_limit or DEFAULT_RATE
    app = create_app(token=token, rate_limit=rate_limit)
    # A bounded shutdown: requests still waiting on a reference render are cut off after a few seconds.
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            http=_json_400_protocol(), timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def run():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            print(f"chatgold service on http://{host}:{bound} (OpenAPI: /openapi.json)", flush=True)
            if ready_file:
                from pathlib import Path

                Path(ready_file).write_text(str(bound))
        await task

    asyncio.run(run())
