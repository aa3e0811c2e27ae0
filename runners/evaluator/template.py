"""ChatTemplate: render a chat template byte-identically to transformers 5.24.0 apply_chat_template(tokenize=False).

The request pipeline follows `PreTrainedTokenizerBase.apply_chat_template` and `render_jinja_template` step
by step, in the same order, so the first failure is the same one HF reports (see README.md for the
surprising parts and why they are kept).
"""
from __future__ import annotations

import datetime as _dt
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, List, Mapping, Optional, Tuple, Union

import jinja2
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError

from ..base import MAX_TEMPLATE_BYTES
from . import environment as envmod
from .errors import (
    EvaluatorError,
    InputError,
    OutputLimitError,
    RenderTimeout,
    ReservedVariableError,
    SecurityViolation,
    TemplateCompileError,
    TemplateRefusal,
    TemplateRenderError,
    TemplateTooLarge,
)

DEFAULT_NOW = "2025-06-15T09:30:00+00:00"  # same as runners.base.DEFAULT_NOW

# Used when a GGUF file carries no tokenizer.chat_template (llama.cpp falls back to ChatML as well).
BUILTIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

# apply_chat_template's own parameters. HFRenderer passes these explicitly, so a kwarg with one of these
# names collides in the call itself (TypeError) ...
_ACT_EXPLICIT = ("tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
                 "tokenize")
_ACT_POSITIONAL = ("self", "conversation")
# ... and these are swallowed by apply_chat_template and never reach the template.
_ACT_CONSUMED = ("sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors",
                 "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
_ACT_QUALNAME = "transformers.tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template()"
_RJT_QUALNAME = "transformers.utils.chat_template_utils.render_jinja_template()"
_RENDER_QUALNAME = "jinja2.environment.Template.render()"


def parse_now(now: Union[str, _dt.datetime, None]) -> _dt.datetime:
    """The case clock as a naive UTC wall-clock time (as runners/hf.py parse_now)."""
    if now is None:
        now = DEFAULT_NOW
    value = now if isinstance(now, _dt.datetime) else _dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value


def _plain(value: Any) -> Any:
    """HF's _plain_template_data for JSON-like input: a fresh copy of plain types, others as "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return f"<{type(value).__name__}>"


def _alias_reasoning(chat: list) -> list:
    aliased = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


@dataclass(frozen=True)
class TracedRender:
    text: str
    spans: list  # list[tracing.Span], UTF-8 byte offsets, contiguous, covering the output exactly once

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogatepass")


# Templates whose compile ran out of time, so the next cell of the same template fails at once.
_COMPILE_TIMEOUTS: "OrderedDict[tuple, RenderTimeout]" = OrderedDict()


def _compile(source: str, tracing: bool) -> jinja2.Template:
    failed = _COMPILE_TIMEOUTS.get((source, tracing))
    if failed is not None:
        raise RenderTimeout(str(failed))
    try:
        return _compile_cached(source, tracing)
    except RenderTimeout as exc:
        _COMPILE_TIMEOUTS[(source, tracing)] = exc
        while len(_COMPILE_TIMEOUTS) > 16:
            _COMPILE_TIMEOUTS.popitem(last=False)
        raise


def check_template_size(source: str) -> None:
    """Refuse a template over MAX_TEMPLATE_BYTES of UTF-8 before anything parses it."""
    if len(source) * 4 <= MAX_TEMPLATE_BYTES:
        return
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_TEMPLATE_BYTES:
        raise TemplateTooLarge(f"the template is {size} bytes, over the limit of {MAX_TEMPLATE_BYTES} bytes "
                               f"(the largest real chat template is under 50 KB)")


@lru_cache(maxsize=256)
def _compile_cached(source: str, tracing: bool) -> jinja2.Template:
    check_template_size(source)
    if tracing:
        env = _tracing_environment()
    else:
        env = envmod.environment()
    # Constant folding runs filters at compile time, and a huge template takes long to parse: both bounded.
    budget = envmod.Budget(time.monotonic() + envmod.COMPILE_TIME_LIMIT, envmod.DEFAULT_MAX_VALUE,
                           envmod.DEFAULT_MAX_VALUE, envmod.COMPILE_TIME_LIMIT, activity="compiling the template")
    token = envmod.set_budget(budget)
    try:
        return env.from_string(source)
    except TemplateSyntaxError as exc:  # TemplateAssertionError (unknown filter/test) is a subclass
        raise TemplateCompileError(str(exc), exc.lineno, reference_type=type(exc).__name__,
                                   reference_message=str(exc)) from None
    except EvaluatorError:
        raise
    except RecursionError as exc:
        raise TemplateCompileError(f"template nests too deeply to compile: {exc}", None,
                                   reference_type="RecursionError", reference_message=str(exc)) from None
    finally:
        envmod.reset_budget(token)


_TRACING_ENV = None


def _tracing_environment():
    global _TRACING_ENV
    if _TRACING_ENV is None:
        from .tracing import TracingEnvironment
        _TRACING_ENV = TracingEnvironment()
    return _TRACING_ENV


def _template_lineno(tb) -> Optional[int]:
    lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


class ChatTemplate:
    """A chat template. Construct with from_string / from_gguf; render with render / render_traced."""

    def __init__(self, source: str, *, origin: str = "<string>", builtin_fallback: bool = False,
                 bos_token: Optional[str] = None, eos_token: Optional[str] = None):
        if not isinstance(source, str):
            raise TypeError(f"{origin}: a chat template must be a str, got {type(source).__name__}")
        self.source = source
        self.origin = origin
        # True when the source had no template and BUILTIN_CHATML is used instead.
        self.builtin_fallback = builtin_fallback
        # Token texts found next to the template (GGUF); render() only uses the tokens it is given.
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._lines = source.splitlines()

    @classmethod
    def from_string(cls, source: str, origin: str = "<string>") -> "ChatTemplate":
        template = cls(source, origin=origin)
        _compile(source, False)  # compile errors surface here, with the line
        return template

    @classmethod
    def from_gguf(cls, path, name: Optional[str] = None) -> "ChatTemplate":
        """Read tokenizer.chat_template (or tokenizer.chat_template.<name>) from a GGUF header."""
        from .gguf import read_chat_template

        found = read_chat_template(path, name)
        if found.template is None:
            warnings.warn(f"{path}: no {found.key} in the GGUF header; using the builtin ChatML template",
                          stacklevel=2)
            return cls(BUILTIN_CHATML, origin=f"{path} (builtin ChatML: no {found.key})", builtin_fallback=True,
                       bos_token=found.bos_token, eos_token=found.eos_token)
        template = cls(found.template, origin=f"{path}:{found.key}", bos_token=found.bos_token,
                       eos_token=found.eos_token)
        _compile(template.source, False)
        return template

    def inventory(self):
        from .inventory import inventory
        return inventory(self.source)

    # -- rendering -------------------------------------------------------------------------------
    def render(self, messages, tools=None, documents=None, add_generation_prompt=False, bos_token=None,
               eos_token=None, kwargs=None, now=None, continue_final_message=False, *,
               time_limit: float = envmod.DEFAULT_TIME_LIMIT, max_output: int = envmod.DEFAULT_MAX_OUTPUT,
               max_value: int = envmod.DEFAULT_MAX_VALUE) -> str:
        return self._run(False, messages, tools, documents, add_generation_prompt, bos_token, eos_token,
                         kwargs, now, continue_final_message, time_limit, max_output, max_value)

    def render_traced(self, messages, tools=None, documents=None, add_generation_prompt=False, bos_token=None,
                      eos_token=None, kwargs=None, now=None, continue_final_message=False, *,
                      time_limit: float = envmod.DEFAULT_TIME_LIMIT, max_output: int = envmod.DEFAULT_MAX_OUTPUT,
                      max_value: int = envmod.DEFAULT_MAX_VALUE) -> TracedRender:
        """Render and say where every output byte came from. Refused with continue_final_message (HF cuts
        the output at a marker there, which has no single origin)."""
        if continue_final_message:
            raise InputError("render_traced does not support continue_final_message")
        return self._run(True, messages, tools, documents, add_generation_prompt, bos_token, eos_token,
                         kwargs, now, continue_final_message, time_limit, max_output, max_value)

    def _run(self, tracing, messages, tools, documents, add_generation_prompt, bos_token, eos_token, kwargs,
             now, continue_final_message, time_limit, max_output, max_value):
        kwargs = dict(kwargs or {})
        _check_call_collisions(kwargs)
        if kwargs.get("return_assistant_tokens_mask"):
            raise InputError("`return_assistant_tokens_mask=True` requires `return_dict=True` and `tokenize=True`",
                             reference_type="ValueError")
        if isinstance(messages, (list, tuple)) and len(messages) == 0:
            raise InputError("Cannot apply chat template to an empty conversation. Provide at least one message.",
                             reference_type="ValueError")
        chat = []
        for message in messages:
            if not isinstance(message, dict):
                raise InputError(f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}.",
                                 reference_type="TypeError")
            chat.append({key: value for key, value in message.items() if value is not None})
        if continue_final_message and add_generation_prompt:
            raise InputError(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
                "when you want the model to continue the final message, and add_generation_prompt when you want to "
                "add a header that will prompt it to start a new assistant message instead.",
                reference_type="ValueError")
        if kwargs.get("sanitize_control_tokens"):
            raise InputError("`sanitize_control_tokens=True` requires `tokenize=True` and is not compatible with "
                             "`return_assistant_tokens_mask=True`.", reference_type="ValueError")
        variables = {}
        if bos_token is not None:
            variables["bos_token"] = bos_token
        if eos_token is not None:
            variables["eos_token"] = eos_token
        for key, value in kwargs.items():
            if key not in _ACT_CONSUMED:
                variables[key] = value  # kwargs overwrite special tokens, as in HF
        if "conversations" in variables:
            raise ReservedVariableError(
                "kwargs may not set 'conversations'",
                reference_type="TypeError",
                reference_message=f"{_RJT_QUALNAME} got multiple values for keyword argument 'conversations'")

        compiled = _compile(self.source, tracing)

        if tools is not None:
            for tool in tools:
                if not isinstance(tool, dict):
                    raise InputError("Tools should either be a JSON schema, or a callable function with type hints "
                                     "and a docstring suitable for auto-conversion to a schema.",
                                     reference_type="ValueError")
        if documents is not None:
            for document in documents:
                if not isinstance(document, dict):
                    raise InputError("Documents should be a list of dicts with 'title' and 'text' keys!",
                                     reference_type="TypeError")
        tools = _plain(tools)
        documents = _plain(documents)
        variables = _plain(variables)
        chat = _alias_reasoning(_plain(chat))

        final_message = None
        if continue_final_message:
            final_message, continue_fields = self._tag_final_message(chat, continue_final_message)
        if "messages" in variables:
            raise ReservedVariableError(
                "kwargs may not set 'messages'", reference_type="TypeError",
                reference_message=f"{_RENDER_QUALNAME} got multiple values for keyword argument 'messages'")
        context = dict(variables, messages=chat, tools=tools, documents=documents,
                       add_generation_prompt=add_generation_prompt)

        budget = envmod.Budget(time.monotonic() + time_limit, max_output, max_value, time_limit, parse_now(now))
        token = envmod.set_budget(budget)
        try:
            chunks = self._generate(compiled, context, budget)
        finally:
            envmod.reset_budget(token)

        if tracing:
            from .tracing import chunks_to_spans
            text, spans = chunks_to_spans(chunks)
            return TracedRender(text, spans)
        rendered = "".join(chunks)
        if continue_final_message:
            rendered = self._cut_at_final_message(rendered, final_message)
        return rendered

    def _generate(self, compiled, context, budget) -> List[str]:
        chunks: List[str] = []
        size = 0
        try:
            for chunk in compiled.generate(**context):
                size += len(chunk)
                if size > budget.max_output:
                    raise OutputLimitError(f"rendered output exceeded the output-size limit of "
                                           f"{budget.max_output} characters")
                budget.check()
                chunks.append(chunk)
        except EvaluatorError:
            raise
        except MemoryError:
            raise
        except Exception as exc:
            raise self._render_error(exc) from exc
        return chunks

    def _render_error(self, exc: Exception) -> EvaluatorError:
        lineno = _template_lineno(exc.__traceback__)
        source_line = self._lines[lineno - 1] if lineno and 0 < lineno <= len(self._lines) else ""
        if type(exc) is TemplateError:
            return TemplateRefusal(str(exc), lineno, source_line=source_line)
        if isinstance(exc, SecurityError):
            return SecurityViolation(f"sandbox refused: {exc}" + (f" (template line {lineno})" if lineno else ""),
                                     reference_type="SecurityError", reference_message=str(exc))
        constructs: Tuple[str, ...] = ()
        if lineno:
            try:
                constructs = tuple(self.inventory().at_line(lineno))
            except Exception:  # the inventory is a diagnostic aid; never mask the real error
                constructs = ()
        return TemplateRenderError(f"{type(exc).__name__}: {exc}", lineno, constructs, source_line,
                                   reference_type=type(exc).__name__, reference_message=str(exc))

    def _tag_final_message(self, chat, continue_final_message):
        if not chat:
            raise InputError("continue_final_message is set but the conversation is empty!",
                             reference_type="ValueError")
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_message = chat[-1].get(field)
        if final_message is None:
            raise InputError(f'continue_final_message is set but the final message has no "{field}" to continue!',
                             reference_type="ValueError")
        continue_fields = [field]
        if field in _REASONING_FIELDS:
            continue_fields = [name for name in _REASONING_FIELDS if chat[-1].get(name) == final_message]
        if not any(name in self.source for name in continue_fields):
            raise InputError(f'continue_final_message is set to "{field}" but this is not an accepted field in '
                             f'the chat_template', reference_type="ValueError")
        elif isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if "text" in block:
                    final_message = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise InputError("continue_final_message is set but we could not find any text to continue in the "
                                 "final message!", reference_type="ValueError")
        else:
            for name in continue_fields:
                try:
                    chat[-1][name] = chat[-1][name] + _CONTINUE_TAG
                except TypeError as exc:  # e.g. a dict or number as content: HF fails the same way
                    raise InputError(str(exc), reference_type="TypeError") from None
        return final_message, continue_fields

    def _cut_at_final_message(self, rendered: str, final_message) -> str:
        try:
            stripped = final_message.strip()
        except AttributeError as exc:
            raise InputError(str(exc), reference_type="AttributeError") from None
        if stripped not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise InputError(
                "continue_final_message is set but the final message does not appear in the chat after "
                "applying the chat template! This can happen if the chat template deletes portions of "
                "the final message. Please verify the chat template and final message in your chat to "
                "ensure they are compatible."
                f"Final message to continue: {stripped}\nRendered chat:\n{rendered}",
                reference_type="ValueError")
        tag_at = rendered.rindex(_CONTINUE_TAG.strip())
        if rendered[tag_at:tag_at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return rendered[:tag_at]
        return rendered[:tag_at].rstrip()


def _check_call_collisions(kwargs: Mapping[str, Any]) -> None:
    """kwargs naming apply_chat_template's own parameters: refused the way the Python call refuses them."""
    for key in kwargs:
        if key in _ACT_EXPLICIT:
            raise ReservedVariableError(
                f"kwargs may not set {key!r}: it is a parameter of the render call, not a template variable",
                reference_type="TypeError",
                reference_message=f"{_ACT_QUALNAME} got multiple values for keyword argument {key!r}")
    for key in kwargs:
        if key in _ACT_POSITIONAL:
            raise ReservedVariableError(
                f"kwargs may not set {key!r}: it is a parameter of the render call, not a template variable",
                reference_type="TypeError",
                reference_message=f"PreTrainedTokenizerBase.apply_chat_template() got multiple values for "
                                  f"argument {key!r}")


def render(template_source: str, messages, **options) -> str:
    """One-shot helper: ChatTemplate(template_source).render(messages, **options)."""
    return ChatTemplate(template_source).render(messages, **options)
