"""The reference runner: HuggingFace transformers' own `apply_chat_template(..., tokenize=False)`.

A real tokenizer object is built offline from a tiny in-memory vocabulary that holds the template's bos/eos
texts, so the template sees exactly the special-token variables transformers passes for such a model and
nothing else. No download ever happens. `strftime_now` reads a frozen clock set from the case's `now`.

The renderer runs inside a harness process (python -m runners.hf) so that a hostile template is bounded in
time and memory and cannot take the suite down with it.

`hf` is this environment's transformers (the pinned reference, pyproject.toml); `hf@VERSION` installs that
transformers release from PyPI (with jinja2 3.1.6 and the tokenizers pip resolves for it) into
<cache>/venvs/transformers-VERSION and runs this module with that interpreter. The renderer adapts to the
release's API: a release whose apply_chat_template has no `continue_final_message` (before 4.45) Skips such
cells, and the frozen clock is installed wherever that release defines strftime_now.
"""
from __future__ import annotations

import contextvars
import datetime as _dt
import os
from functools import lru_cache
from typing import Optional

from .base import Outcome, Raised, RefusalKind, Rendered, RenderRequest, Skipped
from .command import CommandRunner
from .harness import python_harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_frozen_now: contextvars.ContextVar[Optional[_dt.datetime]] = contextvars.ContextVar("chatgold_now", default=None)


def parse_now(now: str) -> _dt.datetime:
    """The case clock as a naive UTC wall-clock time (what datetime.now() returns on a UTC machine)."""
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
    import jinja2
    import tokenizers
    import transformers

    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}


class HFRenderer:
    """Renders in this process with the real transformers. Use HFRunner for the bounded, isolated form."""

    def __init__(self):
        import importlib
        import inspect

        import transformers
        from transformers import PreTrainedTokenizerBase

        # strftime_now lives in utils/chat_template_utils.py from 4.4x on, in tokenization_utils_base.py before.
        for module_name in ("transformers.utils.chat_template_utils", "transformers.tokenization_utils_base"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if getattr(module, "datetime", None) is _dt.datetime:
                module.datetime = _FrozenDatetime
        self.version = transformers.__version__
        self.parameters = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)

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
        options = {"tools": request.tools, "documents": request.documents,
                   "add_generation_prompt": request.add_generation_prompt}
        if "continue_final_message" in self.parameters:
            options["continue_final_message"] = request.continue_final_message
        elif request.continue_final_message:
            return Skipped(f"transformers {self.version}'s apply_chat_template has no continue_final_message")
        token = _frozen_now.set(parse_now(request.now))
        try:
            text = tok.apply_chat_template(
                request.messages,
                chat_template=request.template,
                tokenize=False,
                **options,
                **dict(request.kwargs),
            )
        except MemoryError:
            raise
        except Exception as exc:  # every failure inside apply_chat_template is the reference refusing
            return Raised(f"{type(exc).__name__}: {exc}", refusal_of(type(exc).__name__))
        finally:
            _frozen_now.reset(token)
        return Rendered(text)


class HFRunner(CommandRunner):
    """The reference runner, isolated in a harness process."""

    language = "python"
    homepage = "https://github.com/huggingface/transformers"

    def __init__(self, timeout: float = 20.0, workers: int = 1, version: Optional[str] = None, **options):
        if version is None:
            argv, env = python_harness("runners.hf")
        else:
            from .versions import checkout_harness

            argv, env = checkout_harness(transformers_python(version), "runners.hf")
        super().__init__(argv, name="hf" if version is None else f"hf@{version}", timeout=timeout, workers=workers,
                         env=env, **options)
        self.version = version or _installed_version("transformers")


# The jinja2 the reference pins (pyproject.toml): a versioned transformers renders with the same jinja2, so
# a difference between versions is transformers' own.
JINJA2_REQUIREMENT = "jinja2==3.1.6"


def transformers_python(version: str):
    """The interpreter of a cached environment holding transformers==version (wheels only)."""
    from .versions import ensure_venv

    return ensure_venv(f"transformers-{version}", [f"transformers=={version}", JINJA2_REQUIREMENT],
                       f"transformers {version}", pip_options=["--only-binary", ":all:"])



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
