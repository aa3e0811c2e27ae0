"""The reference runner: HuggingFace transformers' own `apply_chat_template(..., tokenize=False)`.

A real tokenizer object is built offline from a tiny in-memory vocabulary that holds the template's bos/eos
texts, so the template sees exactly the special-token variables transformers passes for such a model and
nothing else. No download ever happens. `strftime_now` reads a frozen clock set from the case's `now`.

The renderer runs inside a harness process (python -m runners.hf) so that a hostile template is bounded in
time and memory and cannot take the suite down with it.
"""
from __future__ import annotations

import contextvars
import datetime as _dt
import os
from functools import lru_cache
from typing import Optional

from .base import Outcome, Raised, RefusalKind, Rendered, RenderRequest
from .command import CommandRunner
from .harness import python_harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_frozen_now: contextvars.ContextVar[Optional[_dt.datetime]] = contextvars.ContextVar("chatgold_now", default=None)


@lru_cache(maxsize=256)
def parse_now(now: str) -> _dt.datetime:
    """The case clock as a naive UTC wall-clock time (what datetime.now() returns on a UTC machine).
    (Cached: every cell of a run reads one of a few clocks.)"""
    value = _dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value


# jinja2's exception types as refusal kinds: a syntax or assertion error is the template failing to compile;
# TemplateError itself is what the template's raise_exception(M) raises (transformers'
# utils/chat_template_utils.py, _compile_jinja_template); every other failure happens while rendering.
_COMPILE_ERRORS = frozenset({"TemplateSyntaxError", "TemplateAssertionError"})
_RAISE_ERROR = "TemplateError"


def refusal_of(type_name: str) -> RefusalKind:
    if type_name in _COMPILE_ERRORS:
        return RefusalKind.COMPILE
    return RefusalKind.RAISE if type_name == _RAISE_ERROR else RefusalKind.RENDER


def reference_refusal(text: str) -> tuple[RefusalKind, str]:
    """(kind, message) of a reference refusal as goldens store it ("<ExceptionType>: <message>"); for
    raise_exception the message is exactly the template's argument."""
    type_name, sep, message = text.partition(": ")
    if not sep or not type_name.isidentifier():
        return RefusalKind.RENDER, text
    return refusal_of(type_name), message


class _FrozenDatetime(_dt.datetime):
    """Replaces `datetime` inside transformers' chat-template module so strftime_now sees the case clock."""

    @classmethod
    def now(cls, tz=None):
        frozen = _frozen_now.get()
        if frozen is None:
            return _dt.datetime.now(tz)
        if tz is not None:
            return frozen.replace(tzinfo=_dt.timezone.utc).astimezone(tz)
        return frozen


def transformers_versions() -> dict:
    """The installed versions, from package metadata (importing transformers to ask costs seconds)."""
    return {dist: _installed_version(dist) for dist in ("transformers", "tokenizers", "jinja2")}


class HFRenderer:
    """Renders in this process with the real transformers. Use HFRunner for the bounded, isolated form."""

    def __init__(self):
        import transformers
        from transformers.utils import chat_template_utils

        chat_template_utils.datetime = _FrozenDatetime
        self.version = transformers.__version__

    @staticmethod
    @lru_cache(maxsize=64)
    def tokenizer(bos_token: Optional[str], eos_token: Optional[str]):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        vocab = {}
        for text in (bos_token, eos_token):
            if text is not None and text not in vocab:
                vocab[text] = len(vocab)
        vocab.setdefault("<chatgold-filler>", len(vocab))
        backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
        special = {}
        if bos_token is not None:
            special["bos_token"] = bos_token
        if eos_token is not None:
            special["eos_token"] = eos_token
        return PreTrainedTokenizerFast(tokenizer_object=backend, **special)

    def render(self, request: RenderRequest) -> Outcome:
        tok = self.tokenizer(request.bos_token, request.eos_token)
        token = _frozen_now.set(parse_now(request.now))
        try:
            text = tok.apply_chat_template(
                request.messages,
                tools=request.tools,
                documents=request.documents,
                chat_template=request.template,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                tokenize=False,
                **dict(request.kwargs),
            )
        except MemoryError:
            raise
        except Exception as exc:  # every failure inside apply_chat_template is the reference refusing
            return Raised(f"{type(exc).__name__}: {exc}", refusal_of(type(exc).__name__))
        finally:
            _frozen_now.reset(token)
        return Rendered(text)


# What the reference's output depends on besides runners/ (the goldens record the first three too).
REFERENCE_DISTS = ("transformers", "tokenizers", "jinja2", "markupsafe")


class HFRunner(CommandRunner):
    """The reference runner, isolated in a harness process."""

    language = "python"
    homepage = "https://github.com/huggingface/transformers"

    def __init__(self, timeout: float = 20.0, workers: int = 1, **options):
        argv, env = python_harness("runners.hf")
        super().__init__(argv, name="hf", timeout=timeout, workers=workers,
                         env=env, **options)
        self.version = _installed_version("transformers")

    def identity(self) -> dict:
        from .identity import python_runner_identity

        return python_runner_identity("hf", ["hf.py"], REFERENCE_DISTS)


def _installed_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def main() -> None:
    from .harness import serve

    renderer = HFRenderer()
    serve({"name": "hf", "version": renderer.version, "language": "python",
           "homepage": HFRunner.homepage}, renderer.render)


if __name__ == "__main__":
    main()
