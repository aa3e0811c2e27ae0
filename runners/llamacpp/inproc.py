"""llama.cpp in-process: llama-server's /apply-template code path without a server start per template.

`LlamaCppInprocRunner` drives the harness of runners/llamacpp/harness (built by harness_build.py from the same
llama.cpp source and options as `llamacpp`'s llama-server): one long-lived process per worker renders any
template per request through the server's own chat layer (oaicompat_chat_params_parse and the chat templates
the server builds at load), and, with `builtin=True`, through the legacy path to llama_chat_apply_template, as
`llamacpp-builtin`'s `--no-jinja` server does. Its outcomes are meant to equal the server routes' byte for
byte (tests/test_llamacpp_inproc.py checks every cell of llama.cpp's bundled templates), which is what lets
the cause reducer render its candidates here (LlamaCppRunner.reduction_runner) while every reproducer it
reports is confirmed on the real llama-server.

Outcomes are shaped as the server routes shape theirs: refusal kinds by the same rules (runner.refusal_kind,
builtin_runner's unsupported messages), and a template the server would not load is refused with the message
the server route reports for a start-up failure.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, Optional

from ..base import Outcome, Raised, RenderRequest, Runner
from ..command import CommandRunner
from . import build
from .allocator import allocator_name, find_mimalloc
from .server import LlamaServer

# The harness's prefix for a template the server would not load, followed by llama.cpp's log of the load
# (harness.cpp, LOAD_FAILURE).
LOAD_FAILURE = "llama-server would not load the template: "
# llama-server exits with status 1 when its model (so its chat template) does not load (tools/server/server.cpp,
# llama_server: `if (!ctx_server.load_model(params)) ... return 1`); the server route words it so (server.py).
START_FAILURE = "llama-server exited during start-up (exit code 1): "


class LlamaCppInprocRunner(Runner):
    """llama-server b11434's /apply-template, in process (see the module docstring)."""

    version = build.LLAMA_CPP_TAG
    language = "c++"
    homepage = "https://github.com/ggml-org/llama.cpp"
    cost_hint = 1.0

    def __init__(self, builtin: bool = False, timeout: float = 20.0, workers: int = 2, start_timeout: float = 60.0):
        from .harness_build import ensure_harness

        self.builtin = builtin
        self.name = "llamacpp-builtin-inproc" if builtin else "llamacpp-inproc"
        binary = self._binary = ensure_harness()
        # As llama-server's: an environment of its own (llama.cpp reads LLAMA_ARG_* as options), C locale, UTC.
        env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
        env.update(LANG="C", LC_ALL="C", TZ="UTC")
        allocator = find_mimalloc()  # as the server gets it (allocator.py): it cannot change a rendered byte
        if allocator is not None:
            env["LD_PRELOAD"] = str(allocator)
        argv = [str(binary)] + (["--builtin"] if builtin else [])
        self._harness = CommandRunner(argv, name=self.name, timeout=timeout, workers=workers,
                                      start_timeout=start_timeout, env=env)

    def _kind(self, message: str, at_start: bool):
        if self.builtin:
            from .builtin_runner import LlamaCppBuiltinRunner

            return LlamaCppBuiltinRunner.refusal_kind(message, at_start)
        from .runner import refusal_kind

        return refusal_kind(message, at_start)

    def shape(self, outcome: Outcome) -> Outcome:
        """The harness's outcome as the server route reports the same refusal."""
        if not isinstance(outcome, Raised):
            return outcome
        message = outcome.message
        if message.startswith(LOAD_FAILURE):
            # the harness hands back llama.cpp's log of the failed load; the reason is read from it as the
            # server route reads it from llama-server's log
            log = message[len(LOAD_FAILURE):].encode("utf-8", "surrogatepass")
            message = START_FAILURE + LlamaServer.failure_reason(log)
            return Raised(message, self._kind(message, at_start=True))
        return Raised(message, self._kind(message, at_start=False))

    def render(self, request: RenderRequest) -> Outcome:
        return self.shape(self._harness.render(request))

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        for outcome in self._harness.render_many(requests):
            yield self.shape(outcome)

    def identity(self) -> Optional[dict]:
        """The harness (its source and the binary built from it) and this package's code, which shapes its
        answers: explain keeps outcomes under it (explain/cache.py)."""
        from ..identity import PROTOCOL_FILES, file_sha256, source_digest as code_digest
        from .harness_build import source_digest

        return {"name": self.name, "tag": build.LLAMA_CPP_TAG, "harness": source_digest(),
                "binary": file_sha256(self._binary), "allocator": allocator_name(),
                "code": code_digest(*PROTOCOL_FILES, "llamacpp")}

    def describe(self) -> dict:
        info = super().describe()
        info["mode"] = ("llama-server's /apply-template code in one process" +
                        (" (--no-jinja: llama_chat_apply_template)" if self.builtin else ""))
        return info

    def close(self) -> None:
        self._harness.close()

