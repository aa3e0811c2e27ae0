"""What stands between a connection and the routes.

BoundedHTTP (uvicorn's httptools protocol, bounded): open connections per client address and in all, the size
of a request's line and headers (431), the time they may take (408), idle keep-alive connections closed
(uvicorn's timeout_keep_alive); every such refusal is a JSON body, and each condition is logged once a minute
at most (with how many were not logged), never once per connection. Then the ASGI middleware: Guard (token,
rate limit, the goldens pool's fail-fast 503), BodyLimit (413, 408), and the error handlers that keep every
error body JSON.
"""
from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import time
from typing import Any, Optional

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from conformance.service.limits import (
    BODY_SECONDS,
    HEADER_SECONDS,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_HEADER_BYTES,
)
from conformance.service.models import JSONBody
from conformance.service.workers import Busy, RateLimiter

LOG = logging.getLogger("uvicorn.error")
LOG_EVERY_SECONDS = 60.0
# After a refusal is written, what the client still sends is read and dropped for this long (this much at
# most) before the socket closes: closing with unread input resets the connection, and the client would never see the answer.
LINGER_SECONDS = 2.0
LINGER_BYTES = 4 * 1024 * 1024


class LogOnce:
    """A condition logged at most once per LOG_EVERY_SECONDS, saying how many were not: a flood of refused
    connections costs one log line a minute, not one per accept."""

    def __init__(self, every: float = LOG_EVERY_SECONDS):
        self.every = every
        self._last: dict = {}
        self._quiet: dict = {}

    def __call__(self, condition: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(condition)
        if last is not None and now - last < self.every:
            self._quiet[condition] = self._quiet.get(condition, 0) + 1
            return
        quiet = self._quiet.pop(condition, 0)
        self._last[condition] = now
        LOG.warning("%s%s", message, f" ({quiet} more since the last report)" if quiet else
                    f" (said at most once every {self.every:g} s)")


log_once = LogOnce()


class ConnectionBook:
    """Open connections per client address and in all."""

    def __init__(self, per_client: int = MAX_CONNECTIONS_PER_CLIENT, total: int = MAX_CONNECTIONS):
        self.per_client, self.total = per_client, total
        self.open: dict = {}
        self.count = 0

    def admit(self, address: str) -> Optional[str]:
        """None when the connection may stay (it is then counted), else why not."""
        if self.count >= self.total:
            return f"the service's limit of {self.total} open connections is reached"
        held = self.open.get(address, 0)
        if held >= self.per_client:
            return f"the limit of {self.per_client} open connections per client address is reached"
        self.open[address] = held + 1
        self.count += 1
        return None

    def release(self, address: str) -> None:
        held = self.open.get(address, 0) - 1
        if held > 0:
            self.open[address] = held
        else:
            self.open.pop(address, None)
        self.count -= 1


def bounded_protocol(book: Optional[ConnectionBook] = None, header_bytes: int = MAX_HEADER_BYTES,
                     header_seconds: float = HEADER_SECONDS):
    """uvicorn's httptools protocol class with the connection limits (module docstring), answering a malformed
    request (bad request line or headers, which never reach the app) with a JSON body as well."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    book = book if book is not None else ConnectionBook()

    class BoundedHTTP(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._address = self.client[0] if self.client else "unknown"
            self._counted = False
            self._awaiting = True  # the next bytes are a request line and headers
            self._header_bytes = 0
            self._tail = b""      # the last bytes seen, for an end of headers split between reads
            self._header_timer = None
            self._refused = False
            self._dropped = 0
            why = book.admit(self._address)
            if why is not None:
                log_once("connections", f"refusing connections: {why}")
                self._refuse(503, f"too many connections: {why}; retry later", linger=False,
                             headers=b"retry-after: 1\r\n")
                return
            self._counted = True
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            if self._counted:
                self._counted = False
                book.release(self._address)
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:  # read and dropped until the socket closes, a little at most
                self._dropped += len(data)
                if self._dropped > LINGER_BYTES:
                    self.transport.close()
                return
            if self._awaiting:
                # Counted before the parser sees it: a header never grows past the limit in memory.
                if self._header_timer is None:
                    self._arm_header_timer()
                seen = self._tail + data
                end = seen.find(b"\r\n\r\n")
                size = len(data) if end < 0 else max(0, end + 4 - len(self._tail))
                if self._header_bytes + size > header_bytes:
                    log_once("headers", f"refusing requests whose line and headers exceed {header_bytes} bytes")
                    self._refuse(431, f"the request line and headers exceed the service's limit of "
                                      f"{header_bytes} bytes")
                    return
                self._header_bytes += size
                self._tail = seen[-3:]
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._awaiting = False
            self._cancel_header_timer()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._awaiting, self._header_bytes, self._tail = True, 0, b""

        def send_400_response(self, msg: str) -> None:
            self._refuse(400, f"malformed HTTP request: {msg}")

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(header_seconds, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or not self._awaiting:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._arm_header_timer()  # an answer is still on its way: the next request waits for it
                return
            log_once("header-time", f"closing connections that sent no complete request within "
                                    f"{header_seconds:g} s")
            self._refuse(408, f"no complete request line and headers within {header_seconds:g} s")

        def _refuse(self, status: int, detail: str, linger: bool = True, headers: bytes = b"") -> None:
            self._refused = True
            self._awaiting = False
            self._cancel_header_timer()
            if self.transport.is_closing():
                return
            body = json.dumps({"detail": detail}).encode()
            reason = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
                      503: b"Service Unavailable"}[status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n%s\r\n%s" % (status, reason, len(body), headers, body))
            if not linger:
                self.transport.close()
                return
            try:
                self.transport.write_eof()
            except (OSError, RuntimeError, NotImplementedError):
                pass
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

    return BoundedHTTP


_QUIET_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def quiet_exception_handler(loop, context: dict) -> None:
    """The event loop's handler: running out of file descriptors (or buffers) while accepting is logged once a
    minute, not as a traceback per accept; anything else as the loop would."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in _QUIET_ERRNOS:
        log_once(f"accept-{exc.errno}", f"cannot accept connections: {exc.strerror or exc}")
        return
    loop.default_exception_handler(context)


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
        if scope.get("method") == "POST" and path in ("/v1/goldens", "/v1/compat"):
            state = self.state_of()
            pool = state.goldens_pool if path == "/v1/goldens" else state.compat_pool
            if pool.full():
                busy = Busy(pool.name, pool.retry_after)
                return await _send_error(send, 503, str(busy), [(b"retry-after", str(busy.retry_after).encode())])
        return await self.app(scope, receive, send)


class BodyLimit:
    """Refuse bodies over MAX_BODY_BYTES with 413, whether declared (Content-Length) or streamed, and bodies not
    complete within BODY_SECONDS with 408."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES, seconds: float = BODY_SECONDS):
        self.app = app
        self.limit = limit
        self.seconds = seconds

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
        deadline = time.monotonic() + self.seconds
        while True:
            try:
                event = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return await _send_error(send, 408, f"the request body did not arrive within {self.seconds:g} s",
                                         [(b"connection", b"close")])
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


def install_error_handlers(app: FastAPI) -> None:
    """Every error answer is JSON, whatever the request held: FastAPI's own handlers echo the input in a plain
    JSONResponse, which fails (500, text) on a lone surrogate; and a body that is not JSON at all (bad UTF-8,
    nested past the parser's depth) is a 422 as documented, not FastAPI's 400."""

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        errors = [{**error, "input": _clip(error["input"])} if "input" in error else error for error in exc.errors()]
        return JSONBody({"detail": jsonable_encoder(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        cause = exc.__cause__
        if exc.status_code == 400 and cause is not None and not isinstance(cause, StarletteHTTPException):
            why = ("it nests too deeply" if isinstance(cause, RecursionError)
                   else f"{type(cause).__name__}: {str(cause)[:200]}")
            return JSONBody({"detail": f"the request body is not valid JSON: {why}"}, status_code=422)
        return JSONBody({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        return JSONBody({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)
