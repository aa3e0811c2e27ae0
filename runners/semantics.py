"""The reference's template variables for a render request, rule by rule as runners/protocol/SEMANTICS.md states them.

`reference_bindings(request)` is what the harness protocol sends a version-2 harness that asked for
`bindings`: exactly the variables transformers 5.24.0 `apply_chat_template` binds (R6-R12; with
continue_final_message, the final message already tagged, R22 steps 1-3), or, when the reference refuses the
request before the template sees anything (R2-R5, R7, R8, R22), that refusal. It imports nothing from
transformers: tests/test_semantics.py holds it against the real thing.

`examples()` reads the machine-checkable example of every rule out of SEMANTICS.md.
"""
from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, Optional

SEMANTICS_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol", "SEMANTICS.md")

# R2: apply_chat_template's parameters. The reference passes these explicitly, so a kwarg of that name
# collides in the call itself ...
CALL_EXPLICIT = ("tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
                 "tokenize")
CALL_POSITIONAL = ("self", "conversation")
# ... these are taken by the call and never reach the template ...
CALL_CONSUMED = ("padding", "truncation", "max_length", "return_tensors", "return_dict", "tokenizer_kwargs",
                 "return_assistant_tokens_mask", "sanitize_control_tokens")
# ... this one collides with render_jinja_template's parameter, and `messages` with Template.render's.
RENDER_JINJA_PARAMETER = "conversations"
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")   # R11, in priority order
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "                          # R22

_ACT = "transformers.tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template()"


class Refusal(Exception):
    """The reference refuses the request before rendering; `before_compile`: even a template that does not
    compile gets this refusal (pipeline steps 1-3), otherwise only one that compiles (steps 5-7)."""

    def __init__(self, type_name: str, message: str, before_compile: bool):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.before_compile = before_compile

    def to_dict(self) -> dict:
        return {"message": str(self), "kind": "render", "before_compile": self.before_compile}


def _python_type_name(value: Any) -> str:
    return {type(None): "NoneType", bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "dict"}.get(type(value), type(value).__name__)


def _check_call(kwargs: dict, messages: list, add_generation_prompt: bool, continue_final_message: bool) -> None:
    """Pipeline steps 1-3 (R2-R5), in the reference's order."""
    for key in kwargs:
        if key in CALL_EXPLICIT:
            raise Refusal("TypeError", f"{_ACT} got multiple values for keyword argument {key!r}", True)
    for key in kwargs:
        if key in CALL_POSITIONAL:
            raise Refusal("TypeError", f"PreTrainedTokenizerBase.apply_chat_template() got multiple values for "
                                       f"argument {key!r}", True)
    if kwargs.get("return_assistant_tokens_mask"):
        raise Refusal("ValueError", "`return_assistant_tokens_mask=True` requires `return_dict=True` and "
                                    "`tokenize=True`", True)
    if len(messages) == 0:
        raise Refusal("ValueError", "Cannot apply chat template to an empty conversation. Provide at least one "
                                    "message.", True)
    for message in messages:
        if not isinstance(message, dict):
            raise Refusal("TypeError", f"Chat messages should be dicts, dataclasses or pydantic models, but got "
                                       f"{message!r}.", True)
    if continue_final_message and add_generation_prompt:
        raise Refusal("ValueError", "continue_final_message and add_generation_prompt are not compatible. Use "
                                    "continue_final_message when you want the model to continue the final message, "
                                    "and add_generation_prompt when you want to add a header that will prompt it to "
                                    "start a new assistant message instead.", True)
    if kwargs.get("sanitize_control_tokens"):
        raise Refusal("ValueError", "`sanitize_control_tokens=True` requires `tokenize=True` and is not compatible "
                                    "with `return_assistant_tokens_mask=True`.", True)
    if RENDER_JINJA_PARAMETER in kwargs:
        raise Refusal("TypeError", "transformers.utils.chat_template_utils.render_jinja_template() got multiple "
                                   "values for keyword argument 'conversations'", True)


def alias_reasoning(message: dict) -> dict:
    """R11: the first present of reasoning_content/thinking/reasoning fills `thinking` (first, unless the
    message has its own) and `reasoning_content` (always)."""
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def tag_final_message(messages: list, template: str) -> None:
    """R22 steps 1-3: append the tag to the final message's content (in place)."""
    final = messages[-1].get("content")
    if final is None:
        raise Refusal("ValueError", 'continue_final_message is set but the final message has no "content" to '
                                    'continue!', False)
    if "content" not in template:
        raise Refusal("ValueError", 'continue_final_message is set to "content" but this is not an accepted field '
                                    'in the chat_template', False)
    if isinstance(final, list):
        for block in reversed(final):
            if _has_text(block):
                if not isinstance(block, dict):   # Python: indexing a string or list with "text"
                    kind = "string indices must be integers, not 'str'" if isinstance(block, str) else \
                        "list indices must be integers or slices, not str"
                    raise Refusal("TypeError", kind, False)
                block["text"] = _append_tag(block["text"])
                return
        raise Refusal("ValueError", "continue_final_message is set but we could not find any text to continue in "
                                    "the final message!", False)
    messages[-1]["content"] = _append_tag(final)


def _append_tag(value: Any) -> str:
    if isinstance(value, str):
        return value + CONTINUE_TAG
    if isinstance(value, list):
        raise Refusal("TypeError", 'can only concatenate list (not "str") to list', False)
    raise Refusal("TypeError", f"unsupported operand type(s) for +: '{_python_type_name(value)}' and 'str'", False)


def _has_text(block: Any) -> bool:
    # Python's `"text" in block`: a key test for an object, a substring test for a string.
    if isinstance(block, (dict, str, list)):
        return "text" in block
    raise Refusal("TypeError", f"argument of type '{_python_type_name(block)}' is not iterable", False)


def bindings_for(template: str, bos_token: Optional[str], eos_token: Optional[str], messages: list,
                 tools: Optional[list], documents: Optional[list], add_generation_prompt: bool,
                 continue_final_message: bool, kwargs: dict) -> dict:
    """The variables the reference binds (R6-R12, R22 tagging); raises Refusal where it refuses first."""
    kwargs = dict(kwargs or {})
    _check_call(kwargs, messages, add_generation_prompt, continue_final_message)
    # R4: top-level nulls dropped; a deep copy, so tagging below never touches the caller's data.
    messages = [{key: value for key, value in copy.deepcopy(message).items() if value is not None}
                for message in messages]
    if tools is not None and any(not isinstance(tool, dict) for tool in tools):   # R7
        raise Refusal("ValueError", "Tools should either be a JSON schema, or a callable function with type "
                                    "hints and a docstring suitable for auto-conversion to a schema.", False)
    if documents is not None and any(not isinstance(doc, dict) for doc in documents):   # R8
        raise Refusal("TypeError", "Documents should be a list of dicts with 'title' and 'text' keys!", False)
    messages = [alias_reasoning(message) for message in messages]   # R11
    if continue_final_message:
        tag_final_message(messages, template)   # R22 steps 1-3
    extra: dict = {}
    if bos_token is not None:   # R6
        extra["bos_token"] = bos_token
    if eos_token is not None:
        extra["eos_token"] = eos_token
    for key, value in kwargs.items():   # R10: kwargs win over the special tokens
        if key not in CALL_CONSUMED:
            extra[key] = value
    if "messages" in extra:   # R2: collides in Template.render, after the compile
        raise Refusal("TypeError", "jinja2.environment.Template.render() got multiple values for keyword "
                                   "argument 'messages'", False)
    # R7-R9, R12; in the order the reference passes them (not observable by a template).
    return {"messages": messages, "tools": copy.deepcopy(tools), "documents": copy.deepcopy(documents),
            "add_generation_prompt": bool(add_generation_prompt), **extra}


def reference_bindings(request) -> dict:
    """For a runners.base.RenderRequest: the variables, or {"refused": {message, kind, before_compile}}."""
    try:
        return bindings_for(request.template, request.bos_token, request.eos_token, list(request.messages),
                            request.tools, request.documents, request.add_generation_prompt,
                            request.continue_final_message, dict(request.kwargs))
    except Refusal as refusal:
        return {"refused": refusal.to_dict()}


_EXAMPLE_BLOCK = re.compile(r"^```json\n(.*?)^```", re.S | re.M)
_RULE = re.compile(r"\*\*(R\d+)\.")


def examples(path: str = SEMANTICS_MD) -> list:
    """Every rule example in SEMANTICS.md: dicts with `rule`, `template`, conversation fields and `expected` or
    `raised`, in document order."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found = []
    for match in _EXAMPLE_BLOCK.finditer(text):
        example = json.loads(match.group(1))
        if "template" not in example:
            continue
        rules = _RULE.findall(text, 0, match.start())
        example["rule"] = rules[-1] if rules else None
        found.append(example)
    return found
