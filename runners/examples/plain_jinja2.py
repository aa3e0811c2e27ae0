"""Render a chat template as chatgold's reference does, on plain jinja2, written from SEMANTICS.md alone.

Standard library and jinja2 only: no chatgold, no transformers. It is the engine behind two examples,
vectors_jinja2.py (runs exported test vectors) and minimal_harness.py (a protocol harness), and the proof that
runners/protocol/SEMANTICS.md says everything the reference does: the tests hold it to every golden.

    outcome = render(template, bos_token, eos_token, conversation)
    # ("rendered", text) or ("raised", kind, "<ExceptionType>: <message>"), kind in compile/raise/render

`conversation` holds the conversation fields (messages, tools, documents, add_generation_prompt,
continue_final_message, kwargs, now), as the protocol's render message and a vector's `case` carry them.
Rule numbers below are SEMANTICS.md's.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import OrderedDict

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

TAG = "CONTINUE_FINAL_MESSAGE_TAG "
REASONING = ("reasoning_content", "thinking", "reasoning")
EXPLICIT = ("tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message", "tokenize")
POSITIONAL = ("self", "conversation")
CONSUMED = ("padding", "truncation", "max_length", "return_tensors", "return_dict", "tokenizer_kwargs",
            "return_assistant_tokens_mask", "sanitize_control_tokens")
COMPILE_ERRORS = ("TemplateSyntaxError", "TemplateAssertionError")
DEFAULT_NOW = "2025-06-15T09:30:00+00:00"


class Refused(Exception):
    """A refusal of the reference's own (not raised by jinja2): type name and message, kind render."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


# -- the environment (R13-R20) ---------------------------------------------------------------------------

_clock = {"now": None}  # R19: the conversation's instant, as naive UTC


class Generation(jinja2.ext.Extension):
    """R16: {% generation %}...{% endgeneration %} outputs its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):  # R18
    raise TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):  # R17
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):  # R19
    return _clock["now"].strftime(format)


class TemplateDict:  # R20: dict(...) and dict.fromkeys(...), nothing else
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


# jinja2 names an object by its module and class in refusals (`dict.from_keys` is "'<module>.TemplateDict
# object' has no attribute ..."): the reference's module, so that such a refusal's message is the reference's.
TemplateDict.__module__ = "transformers.utils.chat_template_utils"


def _check_name(name):
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
                            f"{name!r}. Please rename the attribute.")


class TemplateNamespace(jinja2.utils.Namespace):  # R20: no underscore-prefixed names
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def environment() -> ImmutableSandboxedEnvironment:  # R13
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    return env


_ENV = environment()
_COMPILED: "OrderedDict[str, jinja2.Template]" = OrderedDict()


def compile_template(source: str) -> jinja2.Template:
    template = _COMPILED.get(source)
    if template is None:
        template = _ENV.from_string(source)
        _COMPILED[source] = template
        if len(_COMPILED) > 32:
            _COMPILED.popitem(last=False)
    return template


# -- the steps ---------------------------------------------------------------------------------------------

def _check_call(kwargs, messages, add_generation_prompt, continue_final_message):
    """Pipeline steps 1-3: R2, R3, R4 (a message that is not an object), R5."""
    for key in kwargs:
        if key in EXPLICIT:
            raise Refused("TypeError", "transformers.tokenization_utils_base.PreTrainedTokenizerBase."
                                       f"apply_chat_template() got multiple values for keyword argument {key!r}")
    for key in kwargs:
        if key in POSITIONAL:
            raise Refused("TypeError", f"PreTrainedTokenizerBase.apply_chat_template() got multiple values for "
                                       f"argument {key!r}")
    if kwargs.get("return_assistant_tokens_mask"):
        raise Refused("ValueError", "`return_assistant_tokens_mask=True` requires `return_dict=True` and "
                                    "`tokenize=True`")
    if not messages:
        raise Refused("ValueError", "Cannot apply chat template to an empty conversation. Provide at least one "
                                    "message.")
    for message in messages:
        if not isinstance(message, dict):
            raise Refused("TypeError", f"Chat messages should be dicts, dataclasses or pydantic models, but got "
                                       f"{message!r}.")
    if continue_final_message and add_generation_prompt:
        raise Refused("ValueError", "continue_final_message and add_generation_prompt are not compatible.")
    if kwargs.get("sanitize_control_tokens"):
        raise Refused("ValueError", "`sanitize_control_tokens=True` requires `tokenize=True`")
    if "conversations" in kwargs:
        raise Refused("TypeError", "render_jinja_template() got multiple values for keyword argument "
                                   "'conversations'")


def _alias(message: dict) -> dict:  # R11
    reasoning = next((message[k] for k in REASONING if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _tag(messages: list, source: str) -> str:
    """R22 steps 1-3: tag the final message; returns `final`, the text to look for after rendering."""
    final = messages[-1].get("content")
    if final is None:
        raise Refused("ValueError", 'continue_final_message is set but the final message has no "content" to '
                                    'continue!')
    if "content" not in source:
        raise Refused("ValueError", 'continue_final_message is set to "content" but this is not an accepted '
                                    'field in the chat_template')
    if isinstance(final, list):
        for block in reversed(final):
            if "text" in block:   # Python's `in`, as the rule says (a TypeError for a number)
                text = block["text"]
                block["text"] = text + TAG
                return text
        raise Refused("ValueError", "continue_final_message is set but we could not find any text to continue "
                                    "in the final message!")
    messages[-1]["content"] = final + TAG
    return final


def _cut(output: str, final: str) -> str:  # R22 steps 5-6
    if final.strip() not in output or TAG.strip() not in output:
        raise Refused("ValueError", "continue_final_message is set but the final message does not appear in the "
                                    "chat after applying the chat template! This can happen if the chat template "
                                    "deletes portions of the final message. Please verify the chat template and "
                                    "final message in your chat to ensure they are compatible."
                                    f"Final message to continue: {final.strip()}\nRendered chat:\n{output}")
    at = output.rindex(TAG.strip())
    if output[at:at + len(TAG)] == TAG:
        return output[:at]
    return output[:at].rstrip()


def naive_utc(now: str) -> dt.datetime:  # R19
    value = dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


def _refusal(exc: BaseException) -> tuple:  # R23
    name = type(exc).__name__
    if isinstance(exc, Refused):
        return ("raised", "render", f"{exc.type_name}: {exc}")
    kind = "compile" if name in COMPILE_ERRORS else "raise" if type(exc) is TemplateError else "render"
    return ("raised", kind, f"{name}: {exc}")


def drop_nulls(message: dict) -> dict:  # R4
    return {k: v for k, v in message.items() if v is not None}


def render(source: str, bos_token, eos_token, conversation: dict) -> tuple:
    """("rendered", text) or ("raised", kind, message), as the reference would answer."""
    messages = conversation.get("messages") or []
    tools, documents = conversation.get("tools"), conversation.get("documents")
    add_generation_prompt = bool(conversation.get("add_generation_prompt", False))
    continue_final_message = bool(conversation.get("continue_final_message", False))
    kwargs = dict(conversation.get("kwargs") or {})
    try:
        _check_call(kwargs, messages, add_generation_prompt, continue_final_message)
        # R4: a fresh copy without the top-level nulls (tagging below must not touch the caller's data).
        messages = [drop_nulls(json.loads(json.dumps(m))) for m in messages]
        template = compile_template(source)   # step 4
        if tools is not None and any(not isinstance(t, dict) for t in tools):   # R7
            raise Refused("ValueError", "Tools should either be a JSON schema, or a callable function with type "
                                        "hints and a docstring suitable for auto-conversion to a schema.")
        if documents is not None and any(not isinstance(d, dict) for d in documents):   # R8
            raise Refused("TypeError", "Documents should be a list of dicts with 'title' and 'text' keys!")
        messages = [_alias(m) for m in messages]   # R11
        final = _tag(messages, source) if continue_final_message else None   # R22
        variables = {}
        if bos_token is not None:   # R6
            variables["bos_token"] = bos_token
        if eos_token is not None:
            variables["eos_token"] = eos_token
        variables.update((k, v) for k, v in kwargs.items() if k not in CONSUMED)   # R10
        if "messages" in variables:   # R2
            raise Refused("TypeError", "jinja2.environment.Template.render() got multiple values for keyword "
                                       "argument 'messages'")
        variables.update(messages=messages, tools=tools, documents=documents,
                         add_generation_prompt=add_generation_prompt)   # R7-R9, R12
        _clock["now"] = naive_utc(conversation.get("now") or DEFAULT_NOW)
        output = template.render(variables)
        if continue_final_message:
            output = _cut(output, final)
        return ("rendered", output)
    except MemoryError:
        raise
    except Exception as exc:   # every failure is the reference refusing (R23)
        return _refusal(exc)
