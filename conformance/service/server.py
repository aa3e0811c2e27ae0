"""The golden-file service: corpus, cases and goldens over HTTP, plus checking and reference renders.

Engine authors in any language fetch goldens and check cells without Python. The OpenAPI document at
/openapi.json is the contract (docs/service.md). Every id reaches the filesystem only after it was found in
the loaded corpus or case set, so no request can name a path outside goldens/.

No template code runs in this process: new goldens render in the reference's harness process and attribution
in an attribution worker process, each through a bounded fail-fast pool (workers.py) outside the request
threads. Every error body is JSON ({"detail": ...}), whatever the request held, malformed HTTP included.

The parts: limits.py (every documented limit), models.py (the bodies), state.py (what is loaded once, and the
work), routes.py (the handlers), middleware.py (connections, headers, token, rate, body; error bodies); this
module assembles the app and serves it.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from conformance.service.limits import *  # noqa: F401,F403  (the documented limits, importable from here)
from conformance.service.limits import (
    API_VERSION,
    DEFAULT_RATE,
    IDLE_SECONDS,
    LOOPBACK_HOSTS,
    MAX_CONNECTIONS,
    TOKEN_ENV,
)
from conformance.service.middleware import (
    BodyLimit,
    ConnectionBook,
    Guard,
    bounded_protocol,
    install_error_handlers,
    quiet_exception_handler,
)
from conformance.service.models import JSONBody
from conformance.service.routes import build_listing, router
from conformance.service.state import State, check_cells, summary_of  # noqa: F401  (the service's API)
from conformance.service.workers import RateLimiter


def create_app(state: Optional[State] = None, token: Optional[str] = None,
               rate_limit: Optional[float] = None) -> FastAPI:
    """The app. `token`: required as `Authorization: Bearer <token>` on /v1/*; `rate_limit`: requests/s per
    client address (`chatgold serve` sets both when it binds beyond loopback)."""

    @asynccontextmanager
    async def lifespan(app):
        if app.state.service is None:
            app.state.service = State()
        service = app.state.service
        service.listings[((), False)] = await run_in_threadpool(build_listing, service, (), False)
        yield
        service.close()

    app = FastAPI(title="chatgold golden-file service", version=API_VERSION, lifespan=lifespan,
                  default_response_class=JSONBody, openapi_url="/openapi.json",
                  description="Goldens are the byte-exact output of HuggingFace transformers' "
                              "apply_chat_template. Fetch them, check an engine's output against them, "
                              "or have the reference render a new template.")
    app.state.service = state

    def state_of() -> State:
        if app.state.service is None:
            app.state.service = State()
        return app.state.service

    app.include_router(router)
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(Guard, token=token, limiter=RateLimiter(rate_limit) if rate_limit else None,
                       state_of=state_of)
    return app


def _raise_open_files_limit() -> int:
    """The soft limit on open files, raised to the hard limit (connections each hold one)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else 65536
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        return soft if soft != resource.RLIM_INFINITY else 65536
    except (ImportError, ValueError, OSError):
        return 1024


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
    # Connections are bounded (middleware.bounded_protocol; the limits in limits.py): within the descriptors
    # this process may open, with room left for its own files and worker pipes.
    total = min(MAX_CONNECTIONS, _raise_open_files_limit() - 128)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            http=bounded_protocol(ConnectionBook(total=max(16, total))),
                            timeout_keep_alive=IDLE_SECONDS, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def run():
        asyncio.get_running_loop().set_exception_handler(quiet_exception_handler)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            print(f"chatgold service on http://{host}:{bound} (OpenAPI: /openapi.json)", flush=True)
            if ready_file:
                Path(ready_file).write_text(str(bound))
        await task

    asyncio.run(run())
