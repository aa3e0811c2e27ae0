"""One live `llama-server` process serving one GGUF file on 127.0.0.1, rendering via POST /apply-template."""
from __future__ import annotations

import http.client
import json
import os
import re
import resource
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from ..base import describe_exit
from ..proctree import kill_tree, tagged_env, track
from .allocator import find_mimalloc
from .clock import clock_env, write_stamp

LOG_TAIL = 4000
LOG_RECORD = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+ )?([IWEDT]) ")  # [time] level
LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")
# Lines in the server log that say the chat template itself was rejected at start-up.
TEMPLATE_FAILURE_MARKERS = (
    b"chat template", b"jinja", b"common_chat_", b"failed to apply", b"raise_exception",
)


class _Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1 (stdlib http.client).

    Not `requests`: on this hot path (one call per cell) it cost 1.9 ms of client CPU per call against 0.55 ms
    here, measured side by side; on 2 cores the client competes with the server it is waiting for."""

    def __init__(self, port: int):
        self.port = port
        self._conn: Optional[http.client.HTTPConnection] = None

    def request(self, method: str, path: str, body: Optional[bytes], timeout: float) -> tuple:
        """(status, body bytes). Raises OSError / http.client.HTTPException (socket.timeout on a timeout)."""
        reused = self._conn is not None
        try:
            return self._exchange(method, path, body, timeout)
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
            if not reused:
                raise
        # The server closed an idle keep-alive connection: once more, on a fresh one.
        return self._exchange(method, path, body, timeout)

    def _exchange(self, method: str, path: str, body: Optional[bytes], timeout: float) -> tuple:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            self._conn.request(method, path, body=body, headers=headers)
            response = self._conn.getresponse()
            return response.status, response.read()
        except BaseException:
            self.close()  # a failed exchange leaves the connection in an unknown state
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ServerFailure(Exception):
    """The server died, hung or answered with something that is not HTTP+JSON."""

    def __init__(self, message: str, detail: str = "", timed_out: bool = False):
        super().__init__(message)
        self.detail = detail
        self.timed_out = timed_out


class ServerStartFailure(ServerFailure):
    """The server exited (or never listened) before it was ready. template_refused: the template was why."""

    def __init__(self, message: str, detail: str = "", timed_out: bool = False, template_refused: bool = False,
                 reason_lost: bool = False):
        super().__init__(message, detail, timed_out)
        self.template_refused = template_refused
        # The server exited without logging an error: llama.cpp's logger is leaked, not flushed, at exit
        # (common/log.cpp common_log_main, b10488 and b11434), so under load the reason can be lost. Another
        # start of the same server is how to learn it.
        self.reason_lost = reason_lost


# llama.cpp's template analysis is logged at debug level only; as JSON lines its multi-line values stay whole.
ANALYSIS_LOG_ARGS = ("-lv", "5", "--log-jsonl")


def server_argv(binary: Path, model: Path, jinja: bool = True, extra: tuple = (), log_analysis: bool = False) -> list:
    return [
        str(binary), "-m", str(model),
        # --jinja: the template from the file, no --chat-template-file; --no-jinja: llama.cpp's built-in
        # formats (b11434's default is Jinja, common/common.h:644)
        "--jinja" if jinja else "--no-jinja", *extra,
        "--host", "127.0.0.1", "--port", "0",
        "-c", "512", "-np", "1", "-b", "64", "-ub", "64",
        "-t", "1", "-tb", "1", "--threads-http", "2",
        "--no-warmup", "--no-webui", "--offline", "-fit", "off",
        "--no-prefill-assistant",       # else a chat ending with an assistant message is left open
        *(ANALYSIS_LOG_ARGS if log_analysis else ()),
    ]


def _clean_env(extra: dict) -> dict:
    # llama-server reads LLAMA_ARG_* (and a few cloud variables) as options: start from an empty environment
    # so a user's shell cannot change what it renders.
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    env["LANG"] = env["LC_ALL"] = "C"
    env.update(extra)
    return env


class LlamaServer:
    def __init__(self, binary: Path, model: Path, libfaketime: Optional[Path], start_timeout: float = 60.0,
                 memory_limit: int = 4 << 30, jinja: bool = True, extra_args: tuple = (), log_analysis: bool = False):
        self.model = model
        self._workdir = tempfile.TemporaryDirectory(prefix="chatgold-llama-")
        self.stamp_file = Path(self._workdir.name) / "faketime"
        self.log_path = Path(self._workdir.name) / "server.log"
        self._stamp: Optional[str] = None
        extra = {}
        if libfaketime is not None:
            write_stamp(self.stamp_file, "2000-01-01 00:00:00")
            extra = clock_env(libfaketime, self.stamp_file)
        allocator = find_mimalloc()
        if allocator is not None:
            extra["LD_PRELOAD"] = ":".join(filter(None, (str(allocator), extra.get("LD_PRELOAD"))))
        self._log = open(self.log_path, "wb")
        env, self._tag = tagged_env(_clean_env(extra))  # the tag lets stop() find every descendant
        try:
            self.proc = subprocess.Popen(
                server_argv(binary, model, jinja, extra_args, log_analysis), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, env=env, cwd=self._workdir.name, start_new_session=True)
        except OSError as exc:
            self._log.close()
            self._workdir.cleanup()
            raise ServerStartFailure(f"cannot run {binary}: {exc}") from exc
        track(self.proc, self._tag)
        try:  # bound a template that allocates without end (set after exec: no preexec_fn with threads)
            resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (OSError, ValueError):
            pass
        self.frozen_clock = libfaketime is not None
        self.connection: Optional[_Connection] = None
        self.base_url = ""
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        port = None
        delay = 0.002
        while time.monotonic() < deadline:
            if port is None:
                match = LISTENING.search(self.log_bytes())
                if match:
                    port = int(match.group(1))
                    self.base_url = f"http://127.0.0.1:{port}"
                    self.connection = _Connection(port)
            if port is not None:
                try:
                    if self.connection.request("GET", "/health", None, 5)[0] == 200:
                        return
                except (OSError, http.client.HTTPException):
                    pass
            code = self.proc.poll()
            if code is not None:
                log = self.log_bytes()
                refused = any(marker in log.lower() for marker in TEMPLATE_FAILURE_MARKERS)
                lost = not refused and not any(level == "E" for level, _ in self.log_records(log))
                raise ServerStartFailure(f"llama-server exited during start-up ({self.exit_text()}): "
                                         f"{self.failure_reason(log)}", self.log_tail(), template_refused=refused,
                                         reason_lost=lost)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        raise ServerStartFailure(f"llama-server not ready within {timeout:g}s", self.log_tail(), timed_out=True)

    @staticmethod
    def log_records(log: bytes) -> list:
        """[level letter, text] per log record; an error's details continue on lines without the record prefix."""
        records: list = []
        for line in log.decode("utf-8", "replace").splitlines():
            if line.startswith("{"):  # --log-jsonl: one record per line
                try:
                    record = json.loads(line)
                    records.append([str(record.get("level", "")).upper()[:1], str(record.get("msg", "")).strip()])
                    continue
                except ValueError:
                    pass
            match = LOG_RECORD.match(line)
            if match:
                records.append([match.group(1), line[match.end():].strip()])
            elif records and line.strip():
                records[-1][1] += "\n" + line.rstrip()
        return records

    @classmethod
    def failure_reason(cls, log: bytes) -> str:
        """The most telling error of a failed start: the first about the template, else the last error."""
        records = cls.log_records(log)
        errors = [text for level, text in records if level == "E"]
        for text in errors:
            if any(marker.decode() in text.lower() for marker in TEMPLATE_FAILURE_MARKERS):
                return text
        if errors:
            return errors[-1]
        return records[-1][1] if records else "no output"

    def log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except OSError:
            return b""

    def log_tail(self, limit: int = LOG_TAIL) -> str:
        return self.log_bytes()[-limit:].decode("utf-8", "replace")

    def exit_text(self) -> str:
        return describe_exit(self.proc.poll())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def set_now(self, stamp: str) -> None:
        if self.frozen_clock and stamp != self._stamp and self.stamp_file.parent.exists():
            write_stamp(self.stamp_file, stamp)
            self._stamp = stamp

    def call(self, method: str, path: str, body: Optional[dict], timeout: float) -> tuple:
        """(HTTP status, decoded JSON body). ServerFailure when there is no usable answer."""
        if self.connection is None:
            raise ServerFailure("llama-server: not started", self.log_tail())
        payload = None if body is None else json.dumps(body).encode("ascii")  # escaped, as requests sent it
        try:
            status, data = self.connection.request(method, path, payload, timeout)
        except socket.timeout as exc:
            raise ServerFailure(f"llama-server: no response within {timeout:g}s", self.log_tail(),
                                timed_out=True) from exc
        except (OSError, http.client.HTTPException) as exc:
            time.sleep(0.05)  # let a dying process finish so the exit status is known
            raise ServerFailure(f"llama-server: request failed ({self.exit_text()}): {type(exc).__name__}",
                                self.log_tail()) from exc
        try:
            return status, json.loads(data)
        except ValueError as exc:
            raise ServerFailure(f"llama-server: HTTP {status} with a non-JSON body: "
                                f"{data[:200].decode('utf-8', 'replace')!r}", self.log_tail()) from exc

    def apply_template(self, body: dict, timeout: float) -> tuple:
        return self.call("POST", "/apply-template", body, timeout)

    def tokenize(self, content: str, timeout: float) -> tuple:
        """POST /tokenize as the chat endpoint tokenizes its prompt: add_special and parse_special true
        (tools/server/server-context.cpp:5440-5479; the chat path's tokenize_input_prompts(..., true, true),
        :4650, calls the same tokenize_mixed)."""
        return self.call("POST", "/tokenize", {"content": content, "add_special": True, "parse_special": True,
                                               "with_pieces": True}, timeout)

    def stop(self, grace: float = 2.0) -> None:
        if self.connection is not None:
            self.connection.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        kill_tree(self.proc, self._tag)
        try:
            self._log.close()
        except OSError:
            pass
        self._workdir.cleanup()

    def kill(self) -> None:
        self.stop(grace=0)
