"""Ollama v0.33.2 as deployed: the template it picks for a GGUF's chat template, and what its chat route renders.

For each template the runner makes Ollama's choice (runners/ollama/selection.py: an index entry and its
distance, the GGUF's Jinja preferred, the fallback, or an architecture renderer), then renders by that route:
- `go-template`: the curated Go template (runners/ollama/data, imported from ggufdoctor 0.3.0) through real Go
  text/template in the Go harness (runners/ollama/harness), with Ollama's data model and template functions;
- `fallback` and `gguf-preferred`: the GGUF's own Jinja through llama.cpp's Jinja route, the `llamacpp` runner
  at the llama.cpp build Ollama pins (LLAMA_CPP_VERSION b10488 at tag v0.33.0-rc2), after the request has
  passed Ollama's own decoding (the harness in --decode-only mode) and capability checks
  (server/routes.go:2610-2632, capabilities from images.go:187-234), with `enable_thinking` passed as Ollama
  passes `think` (llm/llama_server.go:2178-2198: set, and true by default, when the Jinja supports thinking);
- `renderer`: Ollama's hand-written renderers are not reproduced: Skipped with the reason.
What Ollama's chat API cannot carry is Skipped: add_generation_prompt false, documents, continue_final_message,
template variables other than enable_thinking.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path
from typing import Iterable, Iterator, Optional

from ..base import (Errored, Outcome, Raised, RefusalKind, Rendered, RenderRequest, Runner, RunnerUnavailable,
                    Skipped)
from . import selection
from .selection import ROUTE_FALLBACK, ROUTE_GO, ROUTE_PREFER, ROUTE_RENDERER, Choice

OLLAMA_VERSION = "0.33.2"
OLLAMA_COMMIT = "b79067b0db7417f20108363bc22adb97f35c966a"
# LLAMA_CPP_VERSION at tag v0.33.0-rc2, the newest tag the source was read at.
FALLBACK_RUNNER = "llamacpp@10488"
HOMEPAGE = "https://github.com/ollama/ollama"
MODEL_NAME = "chatgold"
NOT_SENDABLE_KWARGS = "Ollama's chat API cannot pass the template variable"


def request_limits(request: RenderRequest) -> Optional[Skipped]:
    """What Ollama's /api/chat request cannot carry, whatever the route (the Go harness says the same)."""
    if request.documents is not None:
        return Skipped("Ollama's chat API has no documents")
    if request.continue_final_message:
        return Skipped("Ollama's chat API has no continue_final_message")
    if not request.add_generation_prompt:
        return Skipped("Ollama's chat API has no add_generation_prompt: it always renders for generation")
    for key, value in request.kwargs.items():
        if key != "enable_thinking" or not isinstance(value, bool):
            return Skipped(f"{NOT_SENDABLE_KWARGS} {key}")
    return None


data_digest = selection.data_digest


class OllamaRunner(Runner):
    """Ollama v0.33.2's template choice and chat-route render: Go templates through Go, the rest through llama.cpp."""

    name = "ollama"
    version = OLLAMA_VERSION
    language = "go"
    homepage = HOMEPAGE
    cost_hint = 3.0

    def __init__(self, timeout: float = 20.0, workers: int = 1, start_timeout: float = 60.0,
                 fallback: str = FALLBACK_RUNNER, **options):
        from ..command import CommandRunner
        from .build import ensure_harness

        binary = str(ensure_harness())
        self.timeout, self.workers, self.start_timeout = timeout, workers, start_timeout
        self._go = CommandRunner([binary], name="ollama", timeout=timeout, workers=workers,
                                 start_timeout=start_timeout, **options)
        self._decode = CommandRunner([binary, "--decode-only"], name="ollama-decode", timeout=timeout, workers=1,
                                     start_timeout=start_timeout, **options)
        self.fallback_spec = fallback
        self._fallback: Optional[Runner] = None
        self._fallback_error: Optional[str] = None
        self._lock = threading.Lock()

    # -- the choice --------------------------------------------------------------------------------------
    def choice(self, template: str) -> Choice:
        return selection.choose_cached(template)

    def template_facts_of(self, requests: Iterable[RenderRequest]) -> dict:
        """Ollama's choice for each labelled template among these requests. The choice depends on the template
        text alone, so it is reported for cells the result store answers too (render_many never sees them),
        and a reducer's candidates, which carry their original's template id, cannot overwrite it."""
        facts: dict = {}
        for request in requests:
            if request.template_id and request.template_id not in facts:
                facts[request.template_id] = self.choice(request.template).facts()
        return facts

    def describe(self) -> dict:
        info = super().describe()
        info["mode"] = (f"Ollama {OLLAMA_VERSION} ({OLLAMA_COMMIT[:8]}): template.Named over its index, Go "
                        f"templates through Go text/template, the GGUF's Jinja through {self.fallback_spec}")
        return info

    def identity(self) -> Optional[dict]:
        from ..identity import PROTOCOL_FILES, python_identity, source_digest
        from .build import built_go_version
        from .build import source_digest as harness_digest

        if not self._fallback_built():
            return None  # never build llama.cpp just to name the runner; uncached until it is built
        fallback = self._fallback_runner()
        fallback_identity = fallback.identity() if fallback is not None else None
        if fallback_identity is None:
            return None
        return {"name": self.name, "version": OLLAMA_VERSION, "commit": OLLAMA_COMMIT, "harness": harness_digest(),
                "go": built_go_version(), "data": data_digest(), "python": python_identity(),
                "code": source_digest(*PROTOCOL_FILES, "ollama/__init__.py", "ollama/selection.py",
                                      "ollama/build.py"),
                "fallback": fallback_identity}

    def _fallback_built(self) -> bool:
        from .. import parse_spec
        from ..llamacpp import build

        name, version = parse_spec(self.fallback_spec)
        if name != "llamacpp":
            return True
        return build.find_llama_server(build.normalise_build(version) if version else None) is not None

    def _fallback_runner(self) -> Optional[Runner]:
        with self._lock:
            if self._fallback is None and self._fallback_error is None:
                from .. import get_runner

                try:
                    self._fallback = get_runner(self.fallback_spec, workers=self.workers, timeout=self.timeout,
                                                start_timeout=self.start_timeout)
                except (RunnerUnavailable, ValueError) as exc:
                    self._fallback_error = str(exc)
            return self._fallback

    @contextlib.contextmanager
    def scratch_space(self, folder: Path, idle: int = 0):
        """A reducer's candidates on the Jinja route are llama.cpp's: their GGUFs go under `folder`, not the
        models cache, and `idle` servers stay up between batches (LlamaCppRunner.scratch_space)."""
        fallback = self._fallback_runner()
        with (fallback.scratch_space(folder, idle=idle) if fallback is not None else contextlib.nullcontext()):
            yield

    # -- rendering ---------------------------------------------------------------------------------------
    def render(self, request: RenderRequest) -> Outcome:
        return next(iter(self.render_many([request])))

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        requests = list(requests)
        outcomes: list = [None] * len(requests)
        go_cells, jinja_cells = [], []
        for index, request in enumerate(requests):
            choice = self.choice(request.template)
            if choice.route == ROUTE_RENDERER:
                outcomes[index] = Skipped(f"Ollama's hand-written {choice.renderer} renderer is not reproduced")
                continue
            limited = request_limits(request)
            if limited is not None:
                outcomes[index] = limited
            elif choice.route == ROUTE_GO:
                go_cells.append((index, dataclasses.replace(request, template=selection.go_template(choice.template))))
            else:
                jinja_cells.append(index)
        for (index, _), outcome in zip(go_cells, self._go.render_many([cell for _, cell in go_cells])):
            outcomes[index] = outcome
        for index, outcome in zip(jinja_cells, self._render_jinja([requests[i] for i in jinja_cells])):
            outcomes[index] = outcome
        yield from outcomes

    def _render_jinja(self, requests: list) -> list:
        """The GGUF's Jinja through llama.cpp, for requests Ollama's API accepts (decoding, capabilities)."""
        outcomes: list = [None] * len(requests)
        passed = []
        for index, (request, decoded) in enumerate(zip(requests, self._decode.render_many(requests))):
            if not isinstance(decoded, Rendered):
                outcomes[index] = decoded
                continue
            capabilities = selection.jinja_capabilities(request.template)
            if request.tools and "tools" not in capabilities:
                outcomes[index] = Raised(f"{MODEL_NAME} does not support tools", RefusalKind.UNSUPPORTED)
                continue
            think = request.kwargs.get("enable_thinking")
            if "thinking" in capabilities:
                think = True if think is None else think   # routes.go:2616-2620: thinking on by default
            elif think:
                outcomes[index] = Raised(f'"{MODEL_NAME}" does not support thinking', RefusalKind.UNSUPPORTED)
                continue
            kwargs = {} if think is None else {"enable_thinking": think}
            conversation = dataclasses.replace(request.conversation, kwargs=kwargs)
            passed.append((index, dataclasses.replace(request, conversation=conversation)))
        if passed:
            fallback = self._fallback_runner()
            if fallback is None:
                for index, _ in passed:
                    outcomes[index] = Errored(f"ollama: the llama.cpp route ({self.fallback_spec}) is unavailable: "
                                              f"{self._fallback_error}")
            else:
                for (index, _), outcome in zip(passed, fallback.render_many([cell for _, cell in passed])):
                    outcomes[index] = outcome
        return outcomes

    def close(self) -> None:
        self._go.close()
        self._decode.close()
        if self._fallback is not None:
            self._fallback.close()


__all__ = ["OllamaRunner", "Choice", "request_limits", "FALLBACK_RUNNER"]
