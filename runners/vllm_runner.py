"""vLLM's OpenAI chat route (`/v1/chat/completions`, vLLM 0.33.0): the wheel's own chat layer around transformers.

Which code: the vllm 0.33.0 release (tag v0.33.0; every file:line below is that release's, read from its PyPI
wheel vllm-0.33.0-cp38-abi3). The route is the HTTP server (`vllm serve`) with a text-only model whose own chat
template is the cell's template, started with `--enable-auto-tool-choice --tool-call-parser ...` (without them a
request with tools and the default tool_choice is refused before any template runs) and no default
`--chat-template-kwargs`. The case's `kwargs` are the request's `chat_template_kwargs`.

How: the runner renders with the wheel's own functions (runners/vllm_wheel.py loads them from the wheel's files,
torch left out) in a harness process of a cached environment with transformers 5.20.2. This module also holds a
reproduction of the same steps, written from the source with citations (`ReproducedRenderer`): it documents
what vLLM does, and `python -m runners.vllm_runner --compare` measures how often it agrees with the wheel
(docs/engines.md, "vllm").

The steps, in the order vLLM takes them:
1. request validation (entrypoints/openai/chat_completion/protocol.py): `reasoning_content` is renamed to
   `reasoning` (:576-601, `_normalize_messages_before`); `continue_final_message` with `add_generation_prompt`
   is a 400 (:1058-1068); tools are `ChatCompletionToolsParam` (:206-223) whose `function` is
   `FunctionDefinition` (entrypoints/generate/base/protocol.py:298-316): dumped (`tool.model_dump()`,
   renderers/online_renderer.py:297) as {"type", "function": {"name", "description", "parameters"}} with
   `description`/`parameters` None when absent, `strict` only when given, any other key dropped.
2. template kwargs: `build_chat_params` (protocol.py:643-682) merges the request's `chat_template_kwargs` under
   `add_generation_prompt`, `continue_final_message`, `documents` and `reasoning_effort`; `preprocess_chat`
   (online_renderer.py:787-796) adds `tools` and `tokenize=False` as defaults, and `ChatParams.with_defaults`
   (renderers/params.py:117-147) merges the request's over them. `merge_kwargs` (params.py:38-50) drops every
   overriding value that is None or "auto": so no `tools`/`documents` variable is passed when absent, and a
   `chat_template_kwargs` value of None or "auto" never reaches the template.
3. content format (renderers/hf.py:364-597, `_detect_content_format`): the template is parsed with
   transformers' own environment (:567-576) and its AST walked: a `for` loop over a message's `content` (through
   assignments, namespace aliases and macro parameters, :424-564) makes the format "openai", none "string"; a
   template that does not parse is "string" (:712-716).
4. message parsing (renderers/chat_utils/chat_message.py:610-696, :381-500): content None -> []; a string ->
   one text part; parts of type text/input_text/output_text/refusal/thinking are text (:342-345), a text part
   with no text is skipped (:467); "string" format joins the texts with "\\n" (:417-419, an empty text dropped by
   `if parse_res`, :403), "openai" format keeps {"type": "text", "text"} dicts plus the part's unknown keys; an
   unknown part type is a 400 (:549-555). A system message loses a leading Claude Code billing-header line
   (:578-607). The message becomes {role, content} plus: an assistant's `tool_calls` (when not None) and
   `reasoning` (as `reasoning` and `reasoning_content`); a tool message's `tool_call_id`, and its text-only list
   content joined with "\\n" (:661-686); `name` and `task` when strings; a developer message's `tools`. Every
   other key of the request's message is dropped.
5. tool calls (`_postprocess_messages`, chat_message.py:699-771): an empty `tool_calls` list is dropped; a call
   whose type is not "function" or has no function object is a 400; `arguments` that is a string is
   `json.loads`-ed, and invalid JSON, a non-object, None or "" all become {}.
6. developer role (hf.py:600-656, applied at :890-900): when a developer message is present and the template
   never mentions "developer" in quotes, developer messages become system messages (their `tools` dropped) and
   all system messages are merged, joined with "\\n\\n", into one at the front (only when one is not already
   alone there).
7. kwargs filter (`resolve_chat_template_kwargs`, hf.py:768-831): only kwargs that are the tokenizer's
   `apply_chat_template` parameters, variables the template reads (`jinja2.meta.find_undeclared_variables`
   on vLLM's own sandboxed environment with trim/lstrip blocks, a `generation` tag and loop controls) or
   `PythonBackend.apply_chat_template`'s parameters are passed.
8. transformers' `apply_chat_template(conversation, tools=..., chat_template=..., tokenize=False, **kwargs)`
   (hf.py:914-920) with the transformers release vLLM 0.33.0 requires (<5.21.0: 5.20.2), in its cached
   environment; a failure is a 400 carrying the innermost jinja2 error's message (hf.py:834-844, :921-928).

What the reproduction leaves out (the runner, which runs the wheel's code, does not): of the pydantic validation
of `messages` against vLLM's union of OpenAI message types, only the rules the corpus meets are written
(`validate_messages`). Both skip media parts (an image or audio part needs a multimodal
model, which fetches the media and inserts its own placeholder: such a cell is Skipped); the Harmony route
(gpt-oss models) and the Mistral tokenizer route, which do not use the model's Jinja template this way.
"""
from __future__ import annotations

import copy
import json
from collections import deque
from functools import lru_cache
from typing import Any, Optional

from .base import Outcome, Raised, RefusalKind, Rendered, RenderRequest, Skipped, refusal_of
from .command import CommandRunner
from .harness import python_harness

PRODUCT_VERSION = "0.33.0"
# vLLM 0.33.0 requires transformers>=5.16.1,<5.21.0 (the wheel's METADATA): its newest allowed release.
TRANSFORMERS_VERSION = "5.20.2"
HOMEPAGE = "https://github.com/vllm-project/vllm"
SOURCE = "vllm v0.33.0: vllm/renderers/hf.py, vllm/renderers/chat_utils/chat_message.py, vllm/renderers/params.py, " \
         "vllm/entrypoints/openai/chat_completion/protocol.py, vllm/renderers/online_renderer.py"
# A request vLLM refuses before the template runs is an HTTP 400 with this prefix here.
BAD_REQUEST = "400 Bad Request: "

# chat_message.py:336-345
PART_TYPES_TO_SKIP_NONE_CONTENT = ("text", "refusal")
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
# chat_message.py:99-121: the part types vLLM parses; the media ones need a multimodal model.
MEDIA_PART_TYPES = frozenset({"input_image", "image_url", "image_embeds", "audio_embeds", "video_embeds",
                              "prompt_embeds", "image_pil", "audio_url", "input_audio", "video_url"})
_MEDIA_KEYS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
               "audio_url", "input_audio", "video_url")
# The keys of vLLM's content-part TypedDicts (chat_message.py:199-211 collects them from the
# ChatCompletionContentPartParam union, chat_utils/types.py:264-281); a wrapped text part keeps the others.
KNOWN_PART_FIELDS = frozenset({
    "type", "text", "image_url", "input_audio", "file", "refusal", "audio_url", "video_url", "image_pil",
    "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "data", "uuid", "thinking", "closed",
    "name", "encoding", "detail"})
BILLING_HEADER = "x-anthropic-billing-header"  # chat_message.py:575


class BadRequest(Exception):
    """vLLM answers the request with a 400 before the template renders."""


# -- 1. the request ---------------------------------------------------------------------------------------------
def normalize_messages(messages: list) -> list:
    """protocol.py:576-601: a copy of the messages with `reasoning_content` renamed to `reasoning`."""
    out = copy.deepcopy(messages)
    for message in out:
        if not isinstance(message, dict):
            continue
        reasoning_content = message.pop("reasoning_content", None)
        if reasoning_content is not None and message.get("reasoning") is None:
            message["reasoning"] = reasoning_content
    return out


def validate_messages(messages: list) -> list:
    """protocol.py:238 (`messages: list[ChatCompletionMessageParam]`), what pydantic's validation against vLLM's
    union (chat_utils/types.py:284-320 and openai's message TypedDicts) does to the shapes the corpus sends:
    content null is valid only for an assistant, as openai's assistant message, which has no `reasoning`
    (dropped); a tool call needs a string `id`, type "function" and a function with string `name` and
    `arguments` (an object is a 400), and comes out as {id, function: {arguments, name}, type}."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages.{i}: Input should be a valid dictionary with a string role")
        if "content" in message and message["content"] is None:
            if message["role"] != "assistant":
                raise BadRequest(f"messages.{i}.content: Input should be a valid string or list")
            message.pop("reasoning", None)
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise BadRequest(f"messages.{i}.tool_calls: Input should be a valid list")
        checked = []
        for j, call in enumerate(calls):
            path = f"messages.{i}.tool_calls.{j}"
            function = call.get("function") if isinstance(call, dict) else None
            if not (isinstance(call, dict) and isinstance(call.get("id"), str) and call.get("type") == "function"
                    and isinstance(function, dict) and isinstance(function.get("arguments"), str)
                    and isinstance(function.get("name"), str)):
                raise BadRequest(f"{path}: a function tool call needs a string id, type 'function' and a function "
                                 "with string arguments and name")
            checked.append({"id": call["id"], "function": {"arguments": function["arguments"],
                                                           "name": function["name"]}, "type": "function"})
        message["tool_calls"] = checked
    return messages


def _check_type(value, types, path: str, what: str) -> None:
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        raise BadRequest(f"{path}: Input should be {what}")


def tool_dicts(tools: Optional[list]) -> Optional[list]:
    """`[tool.model_dump() for tool in request.tools]` (online_renderer.py:292-297) for the request's tools."""
    if tools is None:
        return None
    _check_type(tools, (list,), "tools", "a valid list")
    dumped = []
    for index, tool in enumerate(tools):
        path = f"tools.{index}"
        _check_type(tool, (dict,), path, "a valid dictionary or instance of ChatCompletionToolsParam")
        if tool.get("type", "function") != "function":
            raise BadRequest(f"{path}.type: Input should be 'function'")
        function = tool.get("function")
        _check_type(function, (dict,), f"{path}.function", "a valid dictionary or instance of FunctionDefinition")
        _check_type(function.get("name"), (str,), f"{path}.function.name", "a valid string")
        for key, types, what in (("description", (str, type(None)), "a valid string"),
                                 ("parameters", (dict, type(None)), "a valid dictionary"),
                                 ("strict", (bool, type(None)), "a valid boolean")):
            _check_type(function.get(key), types, f"{path}.function.{key}", what)
        body = {"name": function["name"], "description": function.get("description"),
                "parameters": function.get("parameters")}
        if function.get("strict") is not None:
            body["strict"] = function["strict"]
        dumped.append({"type": "function", "function": body})
    return dumped


# -- 2. the kwargs ----------------------------------------------------------------------------------------------
UNSET_VALUES = (None, "auto")


def merge_kwargs(defaults: Optional[dict], overrides: Optional[dict]) -> dict:
    """params.py:38-50: the overrides over the defaults, an overriding None or "auto" left out."""
    return dict(defaults or {}) | {k: v for k, v in (overrides or {}).items() if not _unset(v)}


def _unset(value) -> bool:
    # `v not in (None, "auto")` compares with ==: only None and the string "auto" are unset.
    return value is None or (isinstance(value, str) and value == "auto")


def apply_kwargs(request: RenderRequest, tools: Optional[list]) -> dict:
    """What reaches `safe_apply_chat_template` as keyword arguments (before its own filter): steps 2 of the
    module docstring, in vLLM's order."""
    extra = {"add_generation_prompt": request.add_generation_prompt,
             "continue_final_message": request.continue_final_message,
             "documents": request.documents, "reasoning_effort": None}
    chat_template_kwargs = merge_kwargs(dict(request.kwargs), extra)            # protocol.py:652-674
    defaults = merge_kwargs(None, {"tools": tools, "tokenize": False})           # online_renderer.py:787-796
    chat_template_kwargs = merge_kwargs(defaults, chat_template_kwargs)          # params.py:130-136
    return merge_kwargs(chat_template_kwargs, {"chat_template": None, "return_dict": False})  # params.py:149-154


# -- 3. the content format --------------------------------------------------------------------------------------
def _is_var_access(node, varname: str) -> bool:
    import jinja2.nodes as nodes

    if isinstance(node, nodes.Name):
        return node.ctx == "load" and node.name == varname
    if isinstance(node, nodes.Getattr) and "." in varname:
        base, _, attr = varname.rpartition(".")
        return node.attr == attr and _is_var_access(node.node, base)
    return False


def _is_attr_access(node, varname: str, key: str) -> bool:
    import jinja2.nodes as nodes

    if isinstance(node, nodes.Getitem):
        return _is_var_access(node.node, varname) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node, varname: str, key: Optional[str] = None) -> bool:
    """hf.py:390-407: the variable (or its key), also through filters, tests and slices."""
    import jinja2.nodes as nodes

    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _dotted_name(node) -> Optional[str]:
    import jinja2.nodes as nodes

    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    parts = []
    while isinstance(node, nodes.Getattr):
        parts.append(node.attr)
        node = node.node
    if isinstance(node, nodes.Name):
        parts.append(node.name)
        return ".".join(reversed(parts))
    return None


def _aliases_of(root, varname: str) -> list:
    """hf.py:424-473: the names bound to `varname` or its elements, breadth first (the name itself first)."""
    import jinja2.nodes as nodes

    found = [varname]
    seen = {varname}
    pending = deque([varname])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(nodes.Assign):
            lhs, rhs = assign.target, assign.node
            if isinstance(lhs, nodes.Name) and _is_var_or_elems_access(rhs, current):
                found.append(lhs.name)
                if lhs.name != current and lhs.name not in seen:
                    seen.add(lhs.name)
                    pending.append(lhs.name)
            aliases = []
            if (isinstance(lhs, nodes.Name) and isinstance(rhs, nodes.Call) and isinstance(rhs.node, nodes.Name)
                    and rhs.node.name == "namespace"):
                aliases = [f"{lhs.name}.{kw.key}" for kw in rhs.kwargs if _is_var_or_elems_access(kw.value, current)]
            elif isinstance(lhs, (nodes.Getattr, nodes.NSRef)) and _is_var_or_elems_access(rhs, current):
                dotted = _dotted_name(lhs)
                aliases = [dotted] if dotted is not None else []
            for alias in aliases:
                found.append(alias)
                if alias != current and alias not in seen:
                    seen.add(alias)
                    pending.append(alias)
    return found


def _message_loop_targets(root) -> list:
    """hf.py:476-490: the targets of `for` loops over `messages` (or an alias of it)."""
    import jinja2.nodes as nodes

    names = _aliases_of(root, "messages")
    targets = []
    for loop in root.find_all(nodes.For):
        for name in names:
            if _is_var_or_elems_access(loop.iter, name):
                if not isinstance(loop.target, nodes.Name):
                    raise TypeError("loop target is not a name")  # vLLM asserts (hf.py:488)
                targets.append(loop.target.name)
                break
    return targets


def _loops_over_content(root) -> bool:
    """hf.py:493-564: whether any `for` loop iterates a message's content (directly, through a macro parameter
    that receives it, or a top-level loop over a variable named `content`)."""
    import jinja2.nodes as nodes

    message_names = _message_loop_targets(root)

    def is_content(arg) -> bool:
        return any(_is_var_or_elems_access(arg, name, "content") for name in message_names)

    params_by_loop: dict = {}
    loops_in_macros: set = set()
    for macro in root.find_all(nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set = set()
        for call in root.find_all(nodes.Call):
            if isinstance(call.node, nodes.Name) and call.node.name == macro.name:
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and is_content(arg):
                        content_params.add(macro.args[i].name)
                for kwarg in call.kwargs:
                    if isinstance(kwarg, nodes.Keyword) and kwarg.key in param_names and is_content(kwarg.value):
                        content_params.add(kwarg.key)
        for loop in macro.find_all(nodes.For):
            loops_in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params

    for loop in root.find_all(nodes.For):
        if any(_is_var_or_elems_access(loop.iter, name, "content") for name in message_names):
            return True
        params = params_by_loop.get(id(loop))
        if isinstance(loop.iter, nodes.Name) and params is not None and loop.iter.name in params:
            return True
        if id(loop) not in loops_in_macros and isinstance(loop.iter, nodes.Name) and loop.iter.name == "content":
            return True
    return False


@lru_cache(maxsize=64)
def detect_content_format(template: str) -> str:
    """hf.py:567-597 with default "string" (:712-716): "openai" when the template loops over message content."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        root = _compile_jinja_template(template).environment.parse(template)
    except Exception:  # noqa: BLE001 - vLLM logs and falls back to the default
        return "string"
    try:
        return "openai" if _loops_over_content(root) else "string"
    except Exception:  # noqa: BLE001 - hf.py:592-594: an AST walk that fails takes the default
        return "string"


# -- 4./5. the messages -----------------------------------------------------------------------------------------
class MediaPart(Exception):
    """A media content part: vLLM hands it to the model's multimodal processor."""


def _part(part, wrap: bool):
    """chat_message.py:443-500 for a text-only model: the parsed part, or None when it is skipped."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    if not isinstance(part, dict):
        raise BadRequest("Invalid 'type' field in multimodal part.")
    part_type = part.get("type")
    uuid = part.get("uuid")
    if part_type is None or uuid is not None:  # chat_message.py:255-327
        if any(key in part for key in _MEDIA_KEYS):
            raise MediaPart(part_type or "media")
        if "tool_reference" in part:
            name = part.get("tool_reference")
            return {"type": "tool_reference", "name": name} if wrap else name
        if part_type is None:
            raise BadRequest("Missing 'type' field in multimodal part.")
    if not isinstance(part_type, str):
        raise BadRequest("Invalid 'type' field in multimodal part.")
    if part_type in MEDIA_PART_TYPES:
        raise MediaPart(part_type)
    if part_type == "tool_reference":  # chat_message.py:542-547
        name = part.get("name")
        return {"type": "tool_reference", "name": name} if wrap else name
    if part_type not in TEXT_PART_TYPES:
        supported = sorted(TEXT_PART_TYPES | MEDIA_PART_TYPES | {"tool_reference"})
        raise BadRequest(f"Unsupported chat content part type: {part_type!r}. Supported types: "
                         f"{', '.join(supported)}.")
    text = part.get("thinking") if part_type == "thinking" else part.get("text")
    if part_type in PART_TYPES_TO_SKIP_NONE_CONTENT and text is None:
        return None
    if not wrap:
        return text
    result = {"type": "text", "text": text}
    result.update({k: v for k, v in part.items() if k not in KNOWN_PART_FIELDS})
    return result


def _strip_billing_header(parts: list) -> list:
    """chat_message.py:578-607."""
    out = []
    for part in parts:
        if isinstance(part, str):
            text = part
        elif isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
        else:
            text = None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def parse_message(message: dict, content_format: str) -> dict:
    """chat_message.py:610-696 for one request message (text only)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest("messages: each message must be an object with a string role")
    role = message["role"]
    content = message.get("content")
    reasoning = message.get("reasoning")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    elif not isinstance(content, list):
        raise BadRequest("messages: content must be a string, a list of parts or null")
    if role == "system":
        content = _strip_billing_header(content)
    wrap = content_format == "openai"
    parts = [parsed for parsed in (_part(part, wrap) for part in content) if parsed]
    result: dict = {"role": role, "content": parts if wrap else "\n".join(parts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = list(message["tool_calls"])
        if reasoning is not None:
            result["reasoning"] = reasoning
            result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        body = result.get("content")
        if isinstance(body, list):
            if not any(isinstance(item, dict) and item.get("type") != "text" for item in body):
                texts = [item.get("text", "") for item in body if isinstance(item, dict) and item.get("type") == "text"]
                result["content"] = "\n".join(texts) if texts else ""
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if isinstance(message.get("task"), str):
        result["task"] = message["task"]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def postprocess_tool_calls(conversation: list) -> None:
    """chat_message.py:699-771: tool-call `arguments` as objects, an empty `tool_calls` dropped (in place)."""
    for message in conversation:
        if message["role"] != "assistant" or "tool_calls" not in message:
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        if not calls:
            message.pop("tool_calls", None)
            continue
        for item in calls:
            if not isinstance(item, dict):
                raise BadRequest("assistant tool_calls entries must be objects.")
            function = item.get("function")
            if item.get("type", "function") != "function" or not isinstance(function, dict):
                raise BadRequest("chat completions only support assistant tool_calls of type 'function'.")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
                continue
            if isinstance(arguments, dict):
                continue
            parsed = arguments
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    parsed = None
            function["arguments"] = parsed if isinstance(parsed, dict) else {}


def parse_messages(messages: list, content_format: str) -> list:
    """chat_message.py:774-810: every message parsed, then the tool calls post-processed."""
    conversation = [parse_message(message, content_format) for message in messages]
    postprocess_tool_calls(conversation)
    return conversation


# -- 6. the developer role --------------------------------------------------------------------------------------
def supports_developer_role(template: str) -> bool:
    """hf.py:600-601."""
    return '"developer"' in template or "'developer'" in template


def developer_to_system(conversation: list) -> list:
    """hf.py:604-616 then :619-656: developer messages as system ones, system messages merged at the front."""
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = dict(message, role="system")
            message.pop("tools", None)
        converted.append(message)
    contents, others, merge = [], [], False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        if i > 0 or contents:
            merge = True
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(part["text"] if isinstance(part, dict) else part for part in content
                                if (isinstance(part, dict) and "text" in part) or isinstance(part, str))
        if content:
            contents.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *others]


# -- 7. the kwargs filter ---------------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def template_variables(template: str) -> frozenset:
    """hf.py:757-779: the undeclared variables in vLLM's own parse of the template."""
    import jinja2.ext
    import jinja2.meta
    import jinja2.sandbox

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[GenerationTag, jinja2.ext.loopcontrols])
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


@lru_cache(maxsize=1)
def _named_parameters(function) -> frozenset:
    import inspect

    variadic = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return frozenset(p.name for p in inspect.signature(function).parameters.values() if p.kind not in variadic)


def hf_base_parameters() -> frozenset:
    """hf.py:782-800: `PythonBackend.apply_chat_template`'s named parameters."""
    import transformers

    backend = getattr(transformers, "PythonBackend", None) or transformers.PreTrainedTokenizerBase
    return _named_parameters(backend.apply_chat_template)


def filter_kwargs(tokenizer, template: str, kwargs: dict) -> dict:
    """hf.py:803-831 (`resolve_chat_template_kwargs`): kwargs the tokenizer, the template or transformers take."""
    unexpected = {"chat_template", "tokenize"}
    if unexpected & kwargs.keys():
        raise BadRequest(f"Found unexpected chat template kwargs from request: {unexpected & kwargs.keys()}")
    try:
        variables = template_variables(template)
    except Exception:  # noqa: BLE001 - vLLM lets the parse error escape: apply_chat_template reports it below
        raise
    accepted = (_named_parameters(type(tokenizer).apply_chat_template) | variables | hf_base_parameters()) \
        - unexpected
    return {k: v for k, v in kwargs.items() if k in accepted}


# -- 8. the render ----------------------------------------------------------------------------------------------
def template_error_reason(exc: BaseException) -> str:
    """hf.py:834-844: the message of the innermost jinja2 error in the chain, else the exception's."""
    return str(_template_error(exc))


def _template_error(exc: BaseException) -> BaseException:
    from .vllm_wheel import template_error

    return template_error(exc)


class ReproducedRenderer:
    """The reproduction of vLLM 0.33.0's chat route (this module's steps), in this process."""

    def __init__(self):
        from .hf import HFRenderer

        self.hf = HFRenderer()  # installs the frozen clock in transformers' strftime_now
        self.version = PRODUCT_VERSION

    def render(self, request: RenderRequest) -> Outcome:
        from .hf import _frozen_now, parse_now

        if request.continue_final_message and request.add_generation_prompt:  # protocol.py:1058-1068
            return Raised(BAD_REQUEST + "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                          "True.", RefusalKind.RENDER)
        template = request.template
        try:
            tools = tool_dicts(request.tools)
            kwargs = apply_kwargs(request, tools)
            content_format = detect_content_format(template)
            conversation = parse_messages(validate_messages(normalize_messages(request.messages)),
                                          content_format)
            if any(m["role"] == "developer" for m in conversation) and not supports_developer_role(template):
                conversation = developer_to_system(conversation)
            tools = kwargs.pop("tools", None)
            tokenize = kwargs.pop("tokenize", True)
            kwargs.pop("chat_template", None)
            tokenizer = self.hf.tokenizer(request.bos_token, request.eos_token)
            try:
                kwargs = filter_kwargs(tokenizer, template, kwargs)
            except BadRequest:
                raise
            except Exception as exc:  # noqa: BLE001 - the template does not parse: vLLM's 500, not a render
                return Raised(f"{type(exc).__name__}: {exc}", refusal_of(type(exc).__name__))
        except MediaPart as part:
            return Skipped(f"a {part.args[0]} part needs a multimodal model (vLLM fetches the media and inserts the "
                           "model's own placeholder)")
        except BadRequest as exc:
            return Raised(BAD_REQUEST + str(exc), RefusalKind.RENDER)
        token = _frozen_now.set(parse_now(request.now))
        try:
            text = tokenizer.apply_chat_template(conversation=conversation, tools=tools, chat_template=template,
                                                 tokenize=tokenize, **kwargs)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - hf.py:915-924: every failure is the template refusing, a 400
            inner = _template_error(exc)
            return Raised(BAD_REQUEST + template_error_reason(exc), refusal_of(type(inner).__name__))
        finally:
            _frozen_now.reset(token)
        return Rendered(text)


# The files this runner renders with besides its own (runners.hf builds the tokenizer and the clock).
IMPORTS = ("vllm_wheel.py", "hf.py", "vocab.py")


def vllm_python():
    """The interpreter of the cached environment holding vLLM 0.33.0's chat layer (and its sources)."""
    from .vllm_wheel import ensure_environment

    return ensure_environment()


class VLLMRunner(CommandRunner):
    """vLLM 0.33.0's chat route: the wheel's chat layer around transformers 5.20.2, in a harness process."""

    language = "python"
    homepage = HOMEPAGE

    def __init__(self, timeout: float = 20.0, workers: int = 1, **options):
        from .versions import checkout_harness

        argv, env = checkout_harness(vllm_python(), "runners.vllm_runner")
        super().__init__(argv, name="vllm", timeout=timeout, workers=workers, env=env, **options)
        self.version = PRODUCT_VERSION

    def identity(self) -> dict:
        from .identity import python_runner_identity
        from .vllm_wheel import FILES, REQUIREMENTS

        return python_runner_identity("vllm", ["vllm_runner.py", *IMPORTS], vllm=PRODUCT_VERSION,
                                      requirements=list(REQUIREMENTS), wheel_files=list(FILES))


def wheel_renderer():
    """The wheel's chat layer, in this process (the interpreter of `vllm_python()`)."""
    from .hf import HFRenderer
    from .vllm_wheel import WheelRenderer, sources_dir

    HFRenderer()  # installs the frozen clock in transformers' strftime_now
    return WheelRenderer(sources_dir())


def compare(lines, out) -> None:
    """For each wire request (one JSON line), whether the reproduction gives the wheel's outcome: one JSON line
    {"agree": bool, "wheel": kind, "reproduction": kind}. Refusals agree when both refuse (their messages differ:
    pydantic's and vLLM's own texts are not reproduced)."""
    from .base import Conversation

    wheel, reproduced = wheel_renderer(), ReproducedRenderer()
    for line in lines:
        data = json.loads(line)
        request = RenderRequest(data["template"], Conversation.from_dict(data), data.get("bos_token"),
                                data.get("eos_token"))
        a, b = wheel.render(request), reproduced.render(request)
        agree = a.kind == b.kind and (not isinstance(a, Rendered) or a.text == b.text)
        out.write(json.dumps({"agree": agree, "wheel": a.kind, "reproduction": b.kind}) + "\n")
        out.flush()


def main() -> None:
    import sys

    from .harness import serve
    from .hf import HF_MEMORY_LIMIT

    if sys.argv[1:] == ["--compare"]:
        out = sys.stdout
        sys.stdout = sys.stderr
        compare(sys.stdin, out)
        return
    renderer = wheel_renderer()
    serve({"name": "vllm", "version": PRODUCT_VERSION, "language": "python", "homepage": HOMEPAGE,
           "engine": f"vllm {PRODUCT_VERSION} chat layer (wheel), transformers {TRANSFORMERS_VERSION}",
           "source": SOURCE}, renderer.render, memory_limit=HF_MEMORY_LIMIT)


if __name__ == "__main__":
    main()
