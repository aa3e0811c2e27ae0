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

from .base import Outcome, Raised, Rendered, RenderRequest, Skipped, refusal_of
from .command import CommandRunner
from .harness import python_harness
from .identity import dist_versions
from .vocab import byte_level_alphabet

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


# The reference's harness: transformers and its imports take under 200 MB of address space; a template that
# allocates without end (a loop of 10^10 iterations, a string of GBs) gets MemoryError at 1 GiB, an Errored
# cell, long before its time limit. (jinja2's exception types as refusal kinds: runners.base.refusal_of.)
HF_MEMORY_LIMIT = 1024**3


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
    return dist_versions("transformers", "tokenizers", "jinja2")


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


@lru_cache(maxsize=256)
def token_tokenizer(bos_token: Optional[str], eos_token: Optional[str], markers: tuple, add_bos_token: bool,
                    add_eos_token: Optional[bool]):
    """A real transformers tokenizer, built offline, in which every special token is one id: bos, eos and the
    template's markers as added special tokens; any other text one byte-level token per byte. Its
    add_bos_token/add_eos_token are the model's (None: not stated, the class default applies)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = byte_level_alphabet()
    backend = Tokenizer(models.BPE(vocab={char: byte for byte, char in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    specials = [text for text in (bos_token, eos_token, *markers) if text]
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in dict.fromkeys(specials)])
    options = {}
    if bos_token is not None:
        options["bos_token"] = bos_token
    if eos_token is not None:
        options["eos_token"] = eos_token
    flags = {"add_bos_token": add_bos_token}
    if add_eos_token is not None:
        flags["add_eos_token"] = add_eos_token
    try:
        return PreTrainedTokenizerFast(tokenizer_object=backend, **options, **flags)
    except Exception:  # noqa: BLE001 - tokenizers' post-processor template cannot hold a token text with ':'
        # (e.g. "<seed:bos>"): the flags only shape `tokenizer(text)`, which apply_chat_template never uses.
        return PreTrainedTokenizerFast(tokenizer_object=backend, **options)


def reference_feed(text: str, bos_token: Optional[str], eos_token: Optional[str], markers: tuple,
                   add_bos_token: bool, add_eos_token: Optional[bool]) -> tuple:
    """The tokens transformers feeds the model for a rendered chat: `apply_chat_template(tokenize=True)` renders,
    then tokenizes the text with add_special_tokens=False (transformers 5.24.0,
    tokenization_utils_base.py:3191-3200), so the model's add_bos/add_eos never add a token there: the
    template's own BOS is the only one. Returns runners.base.Token tuples."""
    from .base import Token

    tok = token_tokenizer(bos_token, eos_token, tuple(markers), add_bos_token, add_eos_token)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    byte_of = {char: byte for byte, char in enumerate(byte_level_alphabet())}
    added = {token.content for token in tok.added_tokens_decoder.values()}
    out = []
    for token_id, piece in zip(ids, tok.convert_ids_to_tokens(ids)):
        if piece in added:
            out.append(Token(token_id, piece.encode("utf-8", "surrogatepass"), True))
        else:
            out.append(Token(token_id, bytes(byte_of[char] for char in piece), False))
    return tuple(out)
# What the reference's output depends on besides runners/ (the goldens record the first three too).
REFERENCE_DISTS = ("transformers", "tokenizers", "jinja2", "markupsafe")


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
        self.version = version or dist_versions("transformers")["transformers"]
        self.pinned = version is None

    def identity(self) -> dict:
        from .identity import python_runner_identity

        if self.pinned:
            return python_runner_identity("hf", ["hf.py"], REFERENCE_DISTS)
        # hf@VERSION renders in its own cached environment: the versions it was installed with.
        return python_runner_identity(self.name, ["hf.py"], transformers=self.version, jinja2=JINJA2_REQUIREMENT)


# The jinja2 the reference pins (pyproject.toml): a versioned transformers renders with the same jinja2, so
# a difference between versions is transformers' own.
JINJA2_REQUIREMENT = "jinja2==3.1.6"


def transformers_python(version: str):
    """The interpreter of a cached environment holding transformers==version (wheels only)."""
    from .versions import ensure_venv

    return ensure_venv(f"transformers-{version}", [f"transformers=={version}", JINJA2_REQUIREMENT],
                       f"transformers {version}", pip_options=["--only-binary", ":all:"])


def main() -> None:
    from .harness import serve

    renderer = HFRenderer()
    serve({"name": "hf", "version": renderer.version, "language": "python",
           "homepage": HFRunner.homepage}, renderer.render, memory_limit=HF_MEMORY_LIMIT)


if __name__ == "__main__":
    main()
