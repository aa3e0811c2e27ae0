"""The service's documented limits (docs/service.md), in one place: the models, the middleware, the state and
the server read them from here."""
from __future__ import annotations

import re

from runners.base import MAX_TEMPLATE_BYTES

API_VERSION = "1"
# Bodies beyond MAX_BODY_BYTES get 413 before they are parsed.
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
# POST /v1/compat: one template through several engines on every case, one run at a time (COMPAT_QUEUE may
# wait); each render at most COMPAT_CELL_SECONDS, no engine starts after COMPAT_TOTAL_SECONDS (those left are
# listed as not run), at most COMPAT_MAX_ENGINES engines per request.
COMPAT_WORKERS = 1
COMPAT_QUEUE = 2
COMPAT_CELL_SECONDS = 10.0
COMPAT_TOTAL_SECONDS = 300.0
COMPAT_MAX_ENGINES = 8
WORKER_NICE = 19  # the lowest priority: worker processes yield the CPU to the server's own request handling
# Beyond loopback: a token is required and each client address gets DEFAULT_RATE requests/s (bursts of 2x).
DEFAULT_RATE = 20.0
TOKEN_ENV = "CHATGOLD_SERVICE_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,199}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
ID_RE = re.compile(ID_PATTERN)

# Connections (middleware.BoundedHTTP), before any request reaches the app. The request line and headers
# together: at most MAX_HEADER_BYTES (431 beyond), complete within HEADER_SECONDS of the connection or of the
# request's first byte (408 beyond). A connection idle between requests is closed after IDLE_SECONDS; a body
# must arrive within BODY_SECONDS. Open connections: at most MAX_CONNECTIONS_PER_CLIENT per client address and
# MAX_CONNECTIONS in all (further ones get 503 and are closed at once).
MAX_HEADER_BYTES = 64 * 1024
HEADER_SECONDS = 10.0
IDLE_SECONDS = 5.0
BODY_SECONDS = 60.0
MAX_CONNECTIONS_PER_CLIENT = 256
MAX_CONNECTIONS = 1024

__all__ = [name for name in dir() if name.isupper()]
