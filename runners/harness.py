"""Serve a Python renderer over the harness protocol (the server side of runners/protocol).

Python engines (the HF reference, MiniJinja, the example harnesses) run as harness processes too, so that a
template that hangs, exhausts memory or crashes the interpreter costs one process restart, never the run.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from typing import Callable, Optional

from .base import Errored, Outcome, RenderRequest
from .protocol import (
    SUPPORTED_VERSIONS,
    answer_line,
    encode,
    harness_description,
    request_from_message,
    requests_from_batch,
)

# Address-space cap for a harness process: a template that builds a gigantic string fails with MemoryError.
# 2 GiB, as the evaluator's: a Python engine with its imports takes under 200 MB of it.
DEFAULT_MEMORY_LIMIT = 2 * 1024**3
# Conversations a harness process keeps for {"ref": K} (PROTOCOL.md, keep): a run has ~100 distinct ones, and a
# few thousand small dicts cost the process little.
KEEP_LIMIT = 4096
# A batch's answers are held and written together (PROTOCOL.md, hold): one write and one wake-up of chatgold per
# batch instead of per cell, about half of chatgold's CPU per cell. Held answers are written at the latest once
# the first of them has waited this long, so a slow batch still answers as it goes.
HOLD_SECONDS = 0.05


def python_harness(module: str) -> tuple[list, dict]:
    """argv and environment that run `python -m <module>` as a harness, importable from this checkout."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    existing = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=here + (os.pathsep + existing if existing else ""))
    return [sys.executable, "-m", module], env


def limit_memory(limit_bytes: int = DEFAULT_MEMORY_LIMIT) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


def serve(info: dict, render: Callable[[RenderRequest], Outcome], memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
          build: Optional[str] = None, keep: int = KEEP_LIMIT, hold: bool = True, fresh: bool = True) -> None:
    """Answer protocol messages on stdin/stdout until `stop` or end of input, in version 1 or 2 as the client
    asks. `build` (version 2) identifies the engine build so chatgold may reuse earlier outcomes; give it only
    when the outcome is a pure function of the build, the template and the conversation. `keep`: how many
    conversations the process offers to keep (0: none). `hold` (version 2): hold a batch's answers and write
    them together. `fresh=False`: `render` only reads the request (never changes its data), so a kept
    conversation is shared by the cells that refer to it (requests_from_batch)."""
    # The protocol owns the real stdout; anything an engine prints goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout = sys.stderr
    if memory_limit:
        limit_memory(memory_limit)
    # The engine and its imports live as long as the process: out of the collector's walks, which otherwise
    # visit them again at every old collection (the reference's transformers is most of its heap).
    gc.freeze()
    version = 1
    kept: dict = {}  # K -> Conversation, for batches' {"ref": K}

    held: list = []       # answers of this batch not written yet
    held_since = [0.0]    # when the first of them was ready

    def write_held() -> None:
        if held:
            out.write(b"".join(held))
            held.clear()

    def answer(seq, request, holding: bool = False) -> None:
        if isinstance(request, Errored):  # a cell the batch could not name (a ref this process lacks)
            outcome = request
        else:
            try:
                outcome = render(request)
            except MemoryError:
                outcome = Errored("memory limit exceeded while rendering")
            except Exception as exc:  # the renderer's own bug: report it, keep serving
                outcome = Errored(f"harness failed: {type(exc).__name__}: {exc}")
        line = answer_line(seq, outcome, version)
        if not holding:
            out.write(line)
            return
        if not held:
            held_since[0] = time.monotonic()
        held.append(line)
        if time.monotonic() - held_since[0] >= HOLD_SECONDS:
            write_held()

    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError as exc:
            print(f"harness: ignoring a line that is not JSON: {exc}", file=sys.stderr)
            continue
        cmd = message.get("cmd")
        if cmd == "start":
            if message.get("version") not in SUPPORTED_VERSIONS:
                out.write(encode({"error": f"unsupported protocol version {message.get('version')!r}"}))
                return
            version = message["version"]
            out.write(encode(harness_description(info, version, build, keep=keep, hold=hold)))
        elif cmd == "render":
            answer(message.get("seq"), request_from_message(message))
        elif cmd == "batch" and version >= 2:
            for offset, request in enumerate(requests_from_batch(message, kept if keep else None, fresh)):
                answer(message["seq"] + offset, request, holding=hold)
            write_held()
        elif cmd == "stop":
            return
        else:
            print(f"harness: unknown cmd {cmd!r}", file=sys.stderr)
