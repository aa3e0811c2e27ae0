"""Run any executable that speaks the harness protocol (runners/protocol/PROTOCOL.md) as a runner.

Failure handling: a harness that crashes, hangs past the timeout, prints something that is not a protocol
response, or answers with the wrong seq costs that one cell (Errored, with the stderr tail) and a restart;
the next cell gets a fresh process, and the run goes on. A harness that fails to start GIVE_UP_AFTER times in
a row is given up for the rest of the run: its remaining cells are Errored at once with the reason, said once
on stderr. Its stderr is kept in a ring buffer (the last STDERR_KEEP bytes), and ending a harness ends its whole
process tree, descendants that called setsid included (runners/proctree.py).
"""
from __future__ import annotations

import collections
import json
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
from typing import Iterable, Iterator, Optional, Sequence

from .base import (
    Errored,
    Outcome,
    RenderRequest,
    Runner,
    RunnerUnavailable,
    describe_exit,
)
from .proctree import kill_tree, tagged_env, track
from .protocol import (
    PROTOCOL_VERSION,
    KeptConversations,
    ProtocolError,
    batch_message,
    encode,
    encode_batch,
    negotiated_version,
    outcome_from_message,
    render_message,
    start_message,
)

DEFAULT_TIMEOUT = 20.0
START_TIMEOUT = 60.0
# Conversations per batch message (protocol 2): large enough to amortise the template's encoding, small
# enough that a harness crash mid-batch re-sends little.
BATCH_SIZE = 64
# The most conversations one harness process is asked to keep (whatever it offers): the client's own table.
KEEP_MAX = 4096
STDERR_TAIL = 4000
STDERR_KEEP = 64 * 1024  # bytes of a harness's stderr kept (the rest is read and dropped)
# A response line (one outcome, JSON-escaped) is gathered in memory, then joined and decoded: a few times its
# size at once. 32 MiB keeps a worker reading a runaway harness's line under ~200 MB; a real render is KBs.
MAX_LINE = 32 * 1024 * 1024
# Every harness process gets a data-segment cap (RLIMIT_DATA: heap and private writable mappings, not the
# address space V8, Go or a JVM reserve without using): a template that allocates without end fails in its
# harness rather than taking the machine. CHATGOLD_HARNESS_MEMORY_MB sets it for command: harnesses (0: none).
HARNESS_MEMORY_ENV = "CHATGOLD_HARNESS_MEMORY_MB"
DEFAULT_HARNESS_MEMORY = 4 * 1024**3
_OUT_OF_MEMORY = ("out of memory", "MemoryError", "Allocation failed", "invalid size error", "bad_alloc",
                  "memory allocation of", "Cannot allocate memory")


def default_harness_memory() -> Optional[int]:
    configured = os.environ.get(HARNESS_MEMORY_ENV)
    if not configured:
        return DEFAULT_HARNESS_MEMORY
    try:
        megabytes = float(configured)
    except ValueError:
        megabytes = -1.0
    if not 0 <= megabytes < 2**40:
        raise ValueError(f"{HARNESS_MEMORY_ENV}={configured!r}: expected a number of megabytes (0: no cap)")
    return int(megabytes * 1024 * 1024) or None


def limit_process_memory(pid: int, limit: Optional[int]) -> None:
    """Cap a started process's data segment (what it inherits to its children too)."""
    if not limit:
        return
    try:
        import resource

        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not Linux, or the process already gone: its other limits (time) still hold


def last_words(stderr: str) -> str:
    """What a harness's stderr says last: its final line (an exception's type and message), or with
    CHATGOLD_DEBUG=1 all of the tail kept."""
    text = stderr.strip()
    if not text:
        return ""
    if os.environ.get("CHATGOLD_DEBUG"):
        return "stderr:\n" + text
    line = text.splitlines()[-1].strip()
    return line if len(line) <= 300 else line[:300] + " ..."


def memory_note(detail: str) -> str:
    """' (out of memory)' when a harness's last words say so: an engine's allocation failure named as such."""
    return " (out of memory)" if detail and any(marker in detail for marker in _OUT_OF_MEMORY) else ""
GIVE_UP_AFTER = 3  # failed starts in a row after which a runner is given up for the run


class HarnessFailure(Exception):
    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class VersionRefused(HarnessFailure):
    """The harness answered start with an error: it does not speak the version asked for."""


class BatchFailure(HarnessFailure):
    """A batch stopped part-way: `outcomes` holds the answers read before the failure."""

    def __init__(self, failure: HarnessFailure, outcomes: list):
        super().__init__(str(failure), failure.timed_out)
        self.outcomes = outcomes


class StderrRing:
    """Reads a pipe to its end on a thread, keeping only the last `keep` bytes: a harness that writes to stderr
    forever costs a fixed amount of memory and no disk."""

    def __init__(self, pipe, keep: int = STDERR_KEEP):
        self.keep = keep
        self._data = bytearray()
        self._lock = threading.Lock()
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, name="harness-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        fd = self._pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                self._data += chunk
                if len(self._data) > 2 * self.keep:
                    del self._data[:-self.keep]
        try:
            self._pipe.close()
        except OSError:
            pass

    def tail(self, limit: int) -> str:
        with self._lock:
            data = bytes(self._data[-min(limit, self.keep):])
        return data.decode("utf-8", "replace")

    def settle(self, timeout: float = 1.0) -> None:
        """Wait (briefly) for what a dead process wrote last."""
        self._thread.join(timeout)
_DECODE = json.JSONDecoder().decode
try:
    from orjson import loads as _FAST_DECODE  # a third of json's time per response line
except ImportError:  # pragma: no cover - orjson is a dependency; a bare checkout still works
    _FAST_DECODE = None


def _parse_line(line: bytes):
    """json.loads(line), without its encoding detection for the UTF-8 the protocol prescribes. orjson answers
    first: what it accepts it reads as json does, except integers past 64 bits (read as floats), which no field
    chatgold reads from a response can hold; what it refuses (lone surrogates, NaN) goes to json."""
    if _FAST_DECODE is not None:
        try:
            return _FAST_DECODE(line)
        except ValueError:
            pass
    try:
        return _DECODE(line.decode("utf-8", "surrogatepass"))
    except ValueError:
        return json.loads(line)  # anything else: exactly json.loads's answer (or its error)


class HarnessProcess:
    """One live harness process: start handshake, one render at a time, stop."""

    def __init__(self, argv: Sequence[str], env: Optional[dict] = None, cwd: Optional[str] = None,
                 start_timeout: float = START_TIMEOUT, validate: bool = False, version: int = PROTOCOL_VERSION,
                 nice: int = 0, memory_limit: Optional[int] = None):
        self.argv = list(argv)
        self.version = version
        # validate: check every line both ways against runners/protocol/*.schema.json (a violation is a failure).
        self.validate = validate
        env, self.tag = tagged_env(env)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=cwd, start_new_session=True,
            )
        except OSError as exc:
            raise RunnerUnavailable(f"cannot start harness {self.argv!r}: {exc}") from exc
        track(self.proc, self.tag)
        limit_process_memory(self.proc.pid, memory_limit)
        self.stderr = StderrRing(self.proc.stderr)
        if nice:  # set after exec (no preexec_fn with threads); what it starts later inherits it
            try:
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
            except OSError:
                pass
        self._lines: "collections.deque[bytes]" = collections.deque()  # complete lines not read yet
        self._partial: list = []  # pieces of the line being received
        self._partial_size = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.seq = 0
        self.bindings = False
        self.kept = None  # KeptConversations, when the harness keeps conversations
        self.holds = False  # the harness may hold a batch's answers (a failure in a batch is then not placed)
        try:
            self.info = self._handshake(start_timeout)
        except HarnessFailure as exc:
            words = last_words(self.stderr_tail()) if type(exc) is HarnessFailure else ""
            self.kill()  # a harness that never started must not outlive the attempt
            if words:  # why it died (an engine's TypeError, a missing module), not only that it did
                raise HarnessFailure(f"{exc}: {words}", exc.timed_out) from exc
            raise
        except BaseException:
            self.kill()
            raise

    def _handshake(self, timeout: float) -> dict:
        self._send(start_message(self.version))
        line = self._read_line(timeout)
        if self.validate:
            self._check_response("start-response", line)
        try:
            info = json.loads(line)
        except ValueError as exc:
            raise HarnessFailure(f"start response is not JSON: {line[:200]!r}") from exc
        if isinstance(info, dict) and "error" in info and "name" not in info:
            raise VersionRefused(f"the harness refused protocol version {self.version}: {str(info['error'])[:200]}")
        if not isinstance(info, dict) or "name" not in info:
            raise HarnessFailure(f"start response lacks a name: {line[:200]!r}")
        # A harness that ignored the version it was asked for speaks version 1.
        self.version = min(self.version, negotiated_version(info))
        self.bindings = self.version >= 2 and info.get("bindings") is True
        keep = info.get("keep")
        if self.version >= 2 and not self.bindings and type(keep) is int and keep > 0:
            self.kept = KeptConversations(min(keep, KEEP_MAX))
        self.holds = self.version >= 2 and info.get("hold") is True
        return info

    def _check_response(self, kind: str, line: bytes) -> None:
        from .protocol.schema import check_response

        try:
            check_response(kind, line)
        except ProtocolError as exc:
            raise HarnessFailure(f"schema violation: {exc}") from exc

    def _send(self, message: dict) -> None:
        if self.validate:
            from .protocol.schema import check_request

            check_request(message)  # our own bug if this fails: let it raise
        self._write(encode(message))

    def _write(self, line: bytes) -> None:
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise HarnessFailure(f"harness stdin closed ({self._exit_text()})") from exc

    def _exit_text(self) -> str:
        return describe_exit(self.proc.poll())

    def _read_line(self, timeout: float) -> bytes:
        # A read often brings many lines (a batch's answers): they are split once and handed out in order, and a
        # long line is gathered in pieces, so no byte is copied more than twice.
        if self._lines:
            return self._lines.popleft()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessFailure(f"no response within {timeout:g}s", timed_out=True)
            if not self._selector.select(remaining):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                self.proc.wait(timeout=5)
                raise HarnessFailure(f"harness exited ({self._exit_text()})")
            if b"\n" not in chunk:
                self._partial.append(chunk)
                self._partial_size += len(chunk)
                if self._partial_size > MAX_LINE:
                    raise HarnessFailure(f"response line longer than {MAX_LINE} bytes")
                continue
            lines = chunk.split(b"\n")
            if self._partial:
                lines[0] = b"".join(self._partial) + lines[0]
            rest = lines.pop()
            self._partial, self._partial_size = ([rest], len(rest)) if rest else ([], 0)
            self._lines.extend(lines)
            return self._lines.popleft()

    def render(self, request: RenderRequest, timeout: float) -> Outcome:
        self.seq += 1
        self._send(render_message(self.seq, request, self.bindings))
        return self._read_outcome(timeout)

    def render_batch(self, requests: Sequence[RenderRequest], timeout: float) -> list:
        """Outcomes for one template's requests: one batch message in version 2, renders one by one in 1.
        Raises BatchFailure carrying the outcomes read before a failure."""
        outcomes: list = []
        try:
            if self.version < 2 or len(requests) == 1:
                for request in requests:
                    outcomes.append(self.render(request, timeout))
                return outcomes
            if self.validate:
                self._send(batch_message(self.seq + 1, requests, self.bindings, self.kept))
            else:
                self._write(encode_batch(self.seq + 1, requests, self.bindings, self.kept))
            for _ in requests:
                self.seq += 1
                outcomes.append(self._read_outcome(timeout))
            return outcomes
        except HarnessFailure as exc:
            raise BatchFailure(exc, outcomes) from exc

    def _read_outcome(self, timeout: float) -> Outcome:
        line = self._read_line(timeout)
        try:
            message = _parse_line(line)
        except ValueError as exc:
            raise HarnessFailure(f"response is not JSON: {line[:200]!r}") from exc
        if self.validate:
            self._check_response("render-response", line)
        try:
            return outcome_from_message(message, self.seq, self.version)
        except ProtocolError as exc:
            raise HarnessFailure(f"protocol violation: {exc}") from exc

    def stderr_tail(self, limit: int = STDERR_TAIL) -> str:
        if self.proc.poll() is not None:
            self.stderr.settle(0.5)
        return self.stderr.tail(limit)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 2.0) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"cmd": "stop"})
                self.proc.stdin.close()
                self.proc.wait(timeout=grace)
            except (HarnessFailure, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        kill_tree(self.proc, self.tag)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._selector.close()
        self.stderr.settle(0.5)


class CommandRunner(Runner):
    """A runner backed by one or more harness processes (one per worker)."""

    language = "any"

    def __init__(self, argv: Sequence[str], name: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 workers: int = 1, env: Optional[dict] = None, cwd: Optional[str] = None,
                 start_timeout: float = START_TIMEOUT, validate: bool = False, nice: int = 0,
                 protocol: int = PROTOCOL_VERSION, memory_limit: Optional[int] = -1):
        if not argv:
            raise ValueError("command runner needs a command line")
        self.argv = list(argv)
        self.timeout = timeout
        self.workers = max(1, workers)
        self.env = env
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.validate = validate
        self.nice = nice  # added to the harness processes' niceness (a server keeps its own requests first)
        # Bytes of data segment per harness process (-1: DEFAULT_HARNESS_MEMORY or $CHATGOLD_HARNESS_MEMORY_MB).
        self.memory_limit = default_harness_memory() if memory_limit == -1 else memory_limit
        self._idle: "queue.Queue[Optional[HarnessProcess]]" = queue.Queue()
        for _ in range(self.workers):
            self._idle.put(None)
        self._all: list[HarnessProcess] = []
        self._lock = threading.Lock()
        self.restarts = 0
        self._name_override = name
        self.suite_baseline = name is not None  # only the suite's example harnesses are named by the suite
        self.name = name or os.path.basename(self.argv[0])
        self.version = "unknown"
        # The version asked for (1 forces version 1, e.g. to measure what batches gain); lowered to 1 once a
        # harness refuses version 2.
        self.protocol = protocol
        self.build: Optional[str] = None  # version 2: the harness's build identity, when it gives one
        self.harness_name: Optional[str] = None  # the name the harness gives itself
        self._described = False
        self.start_answer: Optional[dict] = None
        self._failed_starts = 0
        self.given_up: Optional[str] = None  # why the runner was given up for the run, once it was

    # Starting the first process tells us the harness's own name, version and protocol version.
    def _spawn(self) -> HarnessProcess:
        if self.given_up is not None:
            raise RunnerUnavailable(self.given_up)
        try:
            proc = self._start_process()
        except RunnerUnavailable as exc:
            with self._lock:
                self._failed_starts += 1
                if self._failed_starts >= GIVE_UP_AFTER and self.given_up is None:
                    self.given_up = (f"{self.name}: given up for this run after {self._failed_starts} failed "
                                     f"starts in a row; the last: {exc}")
                    print(f"chatgold: {self.given_up}", file=sys.stderr, flush=True)
            raise
        with self._lock:
            self._failed_starts = 0
        return proc

    def retry_starts(self) -> None:
        """Forget earlier failed starts (a long-lived user, e.g. the service, gives each request a new chance)."""
        with self._lock:
            self._failed_starts = 0
            self.given_up = None

    def _start_process(self) -> HarnessProcess:
        # The version this start asks for, read once: workers start at the same time, and another worker may
        # lower self.protocol while this one waits for its answer (its refusal of 2 then still calls for a
        # restart with 1, not a failure).
        asked = self.protocol
        try:
            try:
                proc = HarnessProcess(self.argv, env=self.env, cwd=self.cwd, start_timeout=self.start_timeout,
                                      validate=self.validate, version=asked, nice=self.nice,
                                      memory_limit=self.memory_limit)
            except VersionRefused:
                if asked == 1:
                    raise
                # A version-1 harness refuses 2 and exits, as version 1 tells it to: start it again with 1.
                self.protocol = 1
                proc = HarnessProcess(self.argv, env=self.env, cwd=self.cwd, start_timeout=self.start_timeout,
                                      validate=self.validate, version=1, nice=self.nice,
                                      memory_limit=self.memory_limit)
        except HarnessFailure as exc:
            raise RunnerUnavailable(f"harness {self.argv!r} failed to start: {exc}") from exc
        with self._lock:
            self._all.append(proc)
            self.protocol = proc.version
            if not self._described:
                self._described = True
                info = proc.info
                self.start_answer = dict(info)  # exactly what the harness answered (validate shows it)
                self.harness_name = str(info.get("name", self.name))
                if not self._name_override:
                    self.name = str(info.get("name", self.name))
                self.version = str(info.get("version", self.version))
                self.language = str(info.get("language", self.language))
                self.homepage = str(info.get("homepage", self.homepage))
                build = info.get("build") if proc.version >= 2 else None
                self.build = str(build) if build else None
        return proc

    def describe(self) -> dict:
        info = super().describe()
        info["protocol"] = self.protocol
        if self.build:
            info["build"] = self.build
        return info

    def identity(self) -> Optional[dict]:
        """A harness vouches for its outcomes with a protocol-2 `build`; one that gives none is never cached.
        Starts a process to ask, when none has started yet."""
        if not self._described:
            try:
                self.start()
            except RunnerUnavailable:
                return None
        if self.protocol < 2 or not self.build:
            return None
        return {"name": self.harness_name, "version": self.version, "build": self.build, "runner": "command"}

    def start(self) -> dict:
        """Start one process now (rather than on the first render) and return the harness description."""
        proc = self._idle.get()
        try:
            if proc is None or not proc.alive():
                proc = self._spawn()
        finally:
            self._idle.put(proc)
        return self.describe()

    def render(self, request: RenderRequest) -> Outcome:
        proc = self._idle.get()
        try:
            proc, outcome = self._render_on(proc, request)
            return outcome
        finally:
            self._idle.put(proc)

    def _render_on(self, proc: Optional[HarnessProcess], request: RenderRequest) -> tuple:
        """(the process to keep using, outcome): renders on `proc`, starting one first when there is none or
        it died; a failure retires the process (None comes back) and costs only this cell."""
        proc, outcomes = self._render_run(proc, [request])
        return proc, outcomes[0]

    def _render_run(self, proc: Optional[HarnessProcess], requests: list) -> tuple:
        """(the process to keep using, outcomes) for consecutive requests sharing a template: one batch per
        BATCH_SIZE in protocol 2. A failure costs the cell it happened on; the rest go to a fresh process.

        A harness that holds a batch's answers (hold) may have rendered cells past the last answer it wrote
        before it failed, so the failure is not placed there: the unanswered cells of that batch go to a fresh
        process one at a time, where a failure is the cell's own, and batches resume after them."""
        outcomes: list = []
        pending = list(requests)
        singly = 0  # cells to send one at a time (a holding harness's failed batch)
        while pending:
            if proc is None or not proc.alive():
                if proc is not None:
                    self._retire(proc)
                try:
                    proc = self._spawn()
                except RunnerUnavailable as exc:
                    outcomes.extend(Errored(str(exc)) for _ in pending)
                    return None, outcomes
            chunk = pending[:1] if singly else pending[:BATCH_SIZE]
            try:
                done = proc.render_batch(chunk, self.timeout)
            except BatchFailure as exc:
                detail = proc.stderr_tail()
                unplaced = proc.holds and len(chunk) > 1
                self._retire(proc)
                proc = None
                self.restarts += 1
                outcomes.extend(exc.outcomes)
                pending = pending[len(exc.outcomes):]
                if unplaced:
                    singly = len(chunk) - len(exc.outcomes)
                    continue
                outcomes.append(Errored(f"{self.name}: {exc}{memory_note(detail)}", detail, timed_out=exc.timed_out))
                pending = pending[1:]
                singly = max(0, singly - 1)
                continue
            outcomes.extend(done)
            pending = pending[len(chunk):]
            singly = max(0, singly - len(chunk))
        return proc, outcomes

    def _retire(self, proc: HarnessProcess) -> None:
        proc.kill()
        with self._lock:
            if proc in self._all:
                self._all.remove(proc)

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        """Outcomes in request order. With several workers, each worker renders runs of cells that share a
        template on its own process, so an engine that compiles and caches a template does so once per
        template rather than once per process (measured: the evaluator spent a third of its time compiling)."""
        requests = list(requests)
        if not requests:
            return
        runs = _template_runs(requests, -(-len(requests) // self.workers))
        work: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        for number in range(len(runs)):
            work.put(number)
        results: list = [None] * len(requests)
        finished = [threading.Event() for _ in runs]  # runs are consecutive requests: one event each
        abort = threading.Event()

        def worker() -> None:
            proc = self._idle.get()
            try:
                while not abort.is_set():
                    try:
                        number = work.get_nowait()
                    except queue.Empty:
                        return
                    indices = runs[number]
                    if abort.is_set():
                        for index in indices:
                            results[index] = Errored(f"{self.name}: cell not rendered (interrupted)")
                    else:
                        try:
                            proc, outcomes = self._render_run(proc, [requests[i] for i in indices])
                        except Exception as exc:  # a runner bug costs its cells, never the run
                            outcomes = [Errored(f"{self.name}: {type(exc).__name__}: {exc}")] * len(indices)
                        for index, outcome in zip(indices, outcomes):
                            results[index] = outcome
                    finished[number].set()
            finally:
                self._idle.put(proc)

        threads = [threading.Thread(target=worker, name=f"{self.name}-worker", daemon=True)
                   for _ in range(self.workers)]
        for thread in threads:
            thread.start()
        try:
            for number, run in enumerate(runs):
                finished[number].wait()
                for index in run:
                    yield results[index]
        finally:  # a consumer that stops early (or Ctrl-C): workers finish their current cell and leave
            abort.set()

    def close(self) -> None:
        with self._lock:
            procs, self._all = self._all, []
        for proc in procs:
            proc.stop()


def _template_runs(requests: list, longest: int) -> list:
    """Indices of consecutive requests with the same template and special tokens (one batch message can carry
    them), cut at `longest` so that a small batch (one template) still spreads over every worker."""
    runs: list = []
    for index, request in enumerate(requests):
        previous = requests[runs[-1][-1]] if runs else None
        if (previous is not None and len(runs[-1]) < longest
                and (previous.template, previous.bos_token, previous.eos_token)
                == (request.template, request.bos_token, request.eos_token)):
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs
