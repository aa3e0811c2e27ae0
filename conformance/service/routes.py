"""The service's routes: module-level handlers on one APIRouter, each given the process's State
(state.py) by the service_state dependency; the app (server.create_app) mounts them."""
from __future__ import annotations

import asyncio
import fnmatch
import functools
from typing import Optional

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from conformance.corpus.manifest import sha256_text
from conformance.files import ENCODING_ERRORS
from conformance.judge.goldens import read_golden
from conformance.service.models import (
    BatchRequest,
    BatchResult,
    CaseInput,
    CaseList,
    CheckRequest,
    CheckResult,
    CompatRequest,
    ErrorBody,
    GoldenJSON,
    GoldensRequest,
    GoldensResult,
    IdentifyRequest,
    IdentifyResult,
    JSONBody,
    TemplateDetail,
    TemplateList,
)
from conformance.service.limits import MAX_TEMPLATE_BYTES
from conformance.service.state import (
    State,
    attribute,
    check_cells,
    compat_engines,
    render_goldens,
    run_compat,
    summary_of,
)
from conformance.service.workers import Busy

_ERRORS = {400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 413: {"model": ErrorBody},
           422: {"model": ErrorBody, "description": "Malformed JSON, wrong types or values (FastAPI's list of "
                                                    "problems in `detail`)"}}
_BUSY = {503: {"model": ErrorBody, "description": "The reference is busy; retry after Retry-After seconds"}}

router = APIRouter()


def service_state(request: Request) -> State:
    """The process's State, loaded on first use (the app's lifespan loads it at startup)."""
    app = request.app
    if app.state.service is None:
        app.state.service = State()
    return app.state.service


def build_listing(state: State, patterns: tuple, detail: bool) -> bytes:
    """GET /v1/templates' body for one selection, encoded once: the corpus does not change while the service
    runs."""
    entries = state.corpus.select(list(patterns) or None)
    data = TemplateList.model_validate({"count": len(entries), "templates": [summary_of(e, detail)
                                                                             for e in entries]})
    return JSONBody(None).render(data.model_dump(mode="json"))


# Built once per selection (in a thread), then served from memory on the event loop: no thread hop, so the
# listing keeps its latency however busy the request threads are.
@router.get("/v1/templates", response_model=TemplateList, tags=["read"])
async def list_templates(template: Optional[list[str]] = Query(None, max_length=50, description="id globs"),
                         detail: bool = Query(False, description="include constructs and capabilities (slow)"),
                         state: State = Depends(service_state)):
    key = (tuple(template or ()), detail)
    body = state.listings.get(key)
    if body is None:
        body = await run_in_threadpool(build_listing, state, *key)
        if len(state.listings) < 64:
            state.listings[key] = body
    return Response(body, media_type="application/json")

@router.get("/v1/templates/{template_id}", response_model=TemplateDetail, responses=_ERRORS, tags=["read"])
def get_template(template_id: str, state: State = Depends(service_state)):
    entry = state.template(template_id)
    return {**summary_of(entry, True), "source": entry.source()}

# A case as its file has it: absent tools/documents stay absent (the reference binds them to none either way,
# runners/protocol/SEMANTICS.md R7, R8).
@router.get("/v1/cases", response_model=CaseList, response_model_exclude_unset=True, tags=["read"])
def list_cases(case: Optional[list[str]] = Query(None, max_length=50, description="id globs"),
               state: State = Depends(service_state)):
    cases = [c for c in state.cases.values() if not case or any(fnmatch.fnmatchcase(c.id, p) for p in case)]
    return {"count": len(cases), "cases": [c.to_dict() for c in cases]}

@router.get("/v1/cases/{case_id}", response_model=CaseInput, response_model_exclude_unset=True, responses=_ERRORS,
         tags=["read"])
def get_case(case_id: str, state: State = Depends(service_state)):
    return state.case(case_id).to_dict()

@router.get("/v1/goldens/{template_id}/{case_id}", tags=["read"],
         response_class=Response,
         responses={**_ERRORS, 200: {
             "model": GoldenJSON,
             "description": "The golden's exact bytes (text/plain) or, with Accept: application/json, "
                            "a GoldenJSON. Header X-Chatgold-Outcome says rendered or raised.",
             "content": {"text/plain": {"schema": {"type": "string"}}},
             "headers": {"X-Chatgold-Outcome": {"schema": {"type": "string", "enum": ["rendered", "raised"]}}}}})
async def get_golden(template_id: str, case_id: str, request: Request, state: State = Depends(service_state)):
    entry, case = state.template(template_id), state.case(case_id)
    golden = read_golden(entry.id, case.id)
    if golden is None:
        raise HTTPException(404, f"no golden for {entry.id}/{case.id} (run `chatgold goldens update`)")
    headers = {"X-Chatgold-Outcome": golden.kind}
    if "application/json" in request.headers.get("accept", ""):
        body = GoldenJSON(template=entry.id, case=case.id, kind=golden.kind, text=golden.text,
                          bytes=len(golden.data))
        return JSONBody(body.model_dump(), headers=headers)
    return Response(golden.data, media_type="text/plain; charset=utf-8", headers=headers)

@router.post("/v1/check", response_model=CheckResult, responses=_ERRORS, tags=["check"])
async def check(cell: CheckRequest,
                attribute_divergence: bool = Query(True, alias="attribute",
                                                   description="attribute a divergence to a template line"),
                state: State = Depends(service_state)):
    # Classifying is a file read and a byte compare: done on the event loop (a thread hop costs more).
    # Attribution re-renders the template: in the attribution pool, never here.
    result = check_cells(state, [cell], numbered=False)[0]
    if attribute_divergence:
        await attribute(state, [result])
    return result

@router.post("/v1/check/batch", response_model=BatchResult, responses=_ERRORS, tags=["check"])
async def check_batch(batch: BatchRequest, state: State = Depends(service_state)):
    results = await run_in_threadpool(check_cells, state, batch.cells)
    if batch.attribute:
        await attribute(state, results)
    from conformance.judge.pipeline import summary_of as batch_summary

    return {"results": results, "summary": batch_summary(results)}

@router.post("/v1/goldens", response_model=GoldensResult, responses={**_ERRORS, **_BUSY}, tags=["reference"])
async def new_goldens(body: GoldensRequest, state: State = Depends(service_state)):
    data = body.template.encode("utf-8", ENCODING_ERRORS)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise HTTPException(413, f"template is {len(data)} bytes; the limit is {MAX_TEMPLATE_BYTES}")
    cases = [c for c in state.cases.values()
             if not body.cases or any(fnmatch.fnmatchcase(c.id, p) for p in body.cases)]
    if not cases:
        raise HTTPException(400, f"no case matches {body.cases!r} (GET /v1/cases lists them)")
    try:
        future = state.goldens_pool.submit(functools.partial(render_goldens, state, body, cases))
    except Busy as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:  # the server is shutting down under this request
        future.cancel()
        raise HTTPException(503, "the service is shutting down; retry later", headers={"Retry-After": "30"}) \
            from None

@router.post("/v1/compat", responses={**_ERRORS, **_BUSY}, tags=["reference"],
             description="One template through the suite's engines on every case (or the cases chosen): the "
                         "record `chatgold compat --format json` writes (conformance/schemas/compat.schema.json). "
                         "One run at a time; each render is bounded and no engine starts after the run's time "
                         "limit (those left are listed in `not_run`).")
async def compat(body: CompatRequest, state: State = Depends(service_state)):
    data = body.template.encode("utf-8", ENCODING_ERRORS)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise HTTPException(413, f"template is {len(data)} bytes; the limit is {MAX_TEMPLATE_BYTES}")
    engines = compat_engines(body.engines)
    cases = [c for c in state.cases.values()
             if not body.cases or any(fnmatch.fnmatchcase(c.id, p) for p in body.cases)]
    if not cases:
        raise HTTPException(400, f"no case matches {body.cases!r} (GET /v1/cases lists them)")
    try:
        future = state.compat_pool.submit(functools.partial(run_compat, state, body, engines, cases))
    except Busy as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
    try:
        return JSONBody(await asyncio.wrap_future(future))
    except asyncio.CancelledError:  # the server is shutting down under this request
        future.cancel()
        raise HTTPException(503, "the service is shutting down; retry later", headers={"Retry-After": "30"}) \
            from None

@router.post("/v1/identify", response_model=IdentifyResult, responses=_ERRORS, tags=["read"])
def identify(body: IdentifyRequest, state: State = Depends(service_state)):
    sha = body.sha256 or sha256_text(body.template.encode("utf-8", ENCODING_ERRORS))
    entry = state.corpus.by_sha.get(sha)
    if entry is None:
        return {"sha256": sha, "matched": False, "template": None,
                "hint": "not in the corpus: save the template to a file and run `chatgold corpus import <path>`"}
    return {"sha256": sha, "matched": True, "template": summary_of(entry, False)}

