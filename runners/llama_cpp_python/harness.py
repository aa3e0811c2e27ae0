"""The llama-cpp-python harness: run by the interpreter of a cached llama-cpp-python install (see __init__.py).

Reproduces nothing: every step is the package's own. `Llama(model_path=<carrier GGUF>)` per template, then
`create_chat_completion(messages, tools)` with the instance's `tokenize` wrapped to record the prompt text the
chat handler tokenizes and `create_completion` replaced by a stop, so no token is generated. What
create_chat_completion cannot be asked for is Skipped: add_generation_prompt false (Llama builds its
Jinja2ChatFormatter with the default, true), template kwargs, documents, continue_final_message.
"""
from __future__ import annotations

import datetime as _dt
import os
import traceback
from pathlib import Path
from typing import Optional

from ..base import Outcome, Raised, RefusalKind, Rendered, RenderRequest, Skipped
from ..hf import parse_now

# jinja2's compile-time errors; anything else raised while formatting is a render-time refusal, except the
# formatter's own raise_exception (ValueError raised from its local function of that name).
COMPILE_ERRORS = ("TemplateSyntaxError", "TemplateAssertionError")


class _Stop(Exception):
    """Raised in place of generation once the prompt is known."""


class LlamaCppPythonRenderer:
    def __init__(self):
        import llama_cpp
        from llama_cpp import llama_chat_format

        self.version = llama_cpp.__version__
        self._frozen: Optional[_dt.datetime] = None
        renderer = self

        class FrozenDatetime(_dt.datetime):
            @classmethod
            def now(cls, tz=None):
                frozen = renderer._frozen or _dt.datetime.now()
                return frozen if tz is None else frozen.replace(tzinfo=_dt.timezone.utc).astimezone(tz)

        # Jinja2ChatFormatter.strftime_now reads datetime.now() from this module (local time; TZ=UTC here).
        llama_chat_format.datetime = FrozenDatetime
        self._key = None
        self._llama = None
        self._refusal: Optional[Raised] = None
        self._quiet = False
        base = os.environ.get("CHATGOLD_CACHE") or str(Path.home() / ".cache" / "chatgold")
        self.models_dir = Path(base) / "llamacpp-models"

    def info(self) -> dict:
        return {"name": "llama-cpp-python", "version": self.version, "language": "python",
                "homepage": "https://github.com/abetlen/llama-cpp-python"}

    def _load(self, request: RenderRequest) -> None:
        from llama_cpp import Llama

        from ..llamacpp.model import model_for

        key = (request.template, request.bos_token, request.eos_token)
        if key == self._key:
            return
        if self._llama is not None:
            self._llama.close()
        self._llama, self._refusal, self._key = None, None, key
        path = model_for(request.template, request.bos_token or None, request.eos_token or None, self.models_dir)
        try:
            self._llama = Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
        except Exception as exc:  # the formatter is built in __init__: a template jinja2 cannot compile fails here
            kind = RefusalKind.COMPILE if type(exc).__name__ in COMPILE_ERRORS else RefusalKind.RENDER
            self._refusal = Raised(f"{type(exc).__name__}: {exc}", kind)

    def render(self, request: RenderRequest) -> Outcome:
        if not self._quiet:  # serve() owns the protocol's stdout by now; llama.cpp's own output goes to stderr
            os.dup2(2, 1)
            self._quiet = True
        if not request.add_generation_prompt:
            return Skipped("llama-cpp-python's Llama builds its chat formatter with add_generation_prompt=True")
        if request.kwargs:
            return Skipped("create_chat_completion cannot pass template variables "
                           + ", ".join(sorted(request.kwargs)))
        if request.documents is not None:
            return Skipped("create_chat_completion has no documents")
        if request.continue_final_message:
            return Skipped("create_chat_completion has no continue_final_message")
        self._load(request)
        if self._refusal is not None:
            return self._refusal
        llama = self._llama
        captured = {}
        original = type(llama).tokenize

        def tokenize(text, add_bos=True, special=False):
            captured.setdefault("prompt", text)
            return original(llama, text, add_bos, special)

        def stop(*args, **kwargs):
            raise _Stop()

        llama.tokenize, llama.create_completion = tokenize, stop
        self._frozen = parse_now(request.now)
        try:
            llama.create_chat_completion(messages=request.messages, tools=request.tools, max_tokens=1)
        except _Stop:
            pass
        except Exception as exc:
            frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
            if isinstance(exc, ValueError) and frames and frames[-1] == "raise_exception":
                return Raised(f"ValueError: {exc}", RefusalKind.RAISE)
            kind = RefusalKind.COMPILE if type(exc).__name__ in COMPILE_ERRORS else RefusalKind.RENDER
            return Raised(f"{type(exc).__name__}: {exc}", kind)
        finally:
            del llama.tokenize, llama.create_completion
        if "prompt" not in captured:
            return Raised("create_chat_completion did not tokenize a prompt", RefusalKind.RENDER)
        return Rendered(captured["prompt"].decode("utf-8", "surrogateescape"))


def main() -> None:
    from ..harness import serve

    renderer = LlamaCppPythonRenderer()
    serve(renderer.info(), renderer.render)


if __name__ == "__main__":
    main()
