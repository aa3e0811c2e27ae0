"""mistral.rs's HTTP server (`mistralrs serve`, `/v1/chat/completions`) as it renders a chat request, reproduced.

The same engine, environment, rewrites, variables and reasoning controls as the `mistralrs` runner (the Python
API route, runners/mistralrs_runner.py, whose renderer this one extends); what differs is how the server reads
the request (github.com/EricLBuehler/mistral.rs at tag v0.9.2, the newest release tag in the history read;
mistralrs 0.9.5 is the version the `mistralrs` runner's checks pin):
- the body is read by serde into `ChatCompletionRequest` (mistralrs-server-core/src/openai.rs:1134, `messages:
  Either<Vec<Message>, String>`, untagged, so a message its `Message` struct cannot hold fails as "data did
  not match any variant of untagged enum Either"): `Message {content: Option<MessageContent>, role: String,
  name, tool_calls: Option<Vec<ToolCall>>, tool_call_id, reasoning_content (alias reasoning)}` (openai.rs:
  319-333); content a string or a list of maps of strings or string maps (openai.rs:83-86); `ToolCall {id:
  Option<String>, type: "function", function: {name: String, arguments: String (alias parameters)}}`
  (openai.rs:262-290): `arguments` must be the OpenAI wire string.
- each message (mistralrs-server-core/src/chat_completion.rs:632-950, `parse_request`): a missing or null
  content is "" when the message has tool calls, else refused ("No content was provided, expected tool calls to
  be provided."); a string content keeps role, content, reasoning_content, tool_calls (each `{id (the
  function's name when absent), type: "function", function: {name, arguments}}`), tool_call_id and name; a
  one-part list without `type` becomes that part's `text`; any other list is a user message's only, its text
  parts joined with " " into one text part (media parts take the media path, not reproduced: Skipped).
- `chat_template_kwargs`: only `enable_thinking` (a bool) and `reasoning_effort` (a string) are read, when the
  request's own fields are absent (chat_completion.rs:588-603); any other kwarg is ignored with a warning, so
  the template renders without it.
- then mistral.rs's chat-template stage (mistralrs-core/src/pipeline/chat_template.rs @v0.9.2): an
  assistant's tool-call `arguments` string parsed into a mapping when it is a JSON object (lines 494-524, 764);
  for a Liquid tool template (`<|tool_call_start|>`...`<|tool_call_end|>`) an assistant message with tool
  calls gets content "" (lines 565-578). Gemma 4's tool-turn rewrite (lines 580-690) is not reproduced: such
  cells are Skipped.
- tools: as the `mistralrs` runner reads them (mistralrs-mcp's `Tool`); the server's own OpenAI tool
  normalisation (`normalize_chat_completion_tools`) is taken to hold the same function tools.
Refusals carry serde's and the server's words; serde's "at line 1 column C" is not reproduced.

No registry package ships the server for an independent check (the `mistralrs` wheel is the Python API).
"""
from __future__ import annotations

import json

from .base import Raised, RefusalKind, RenderRequest, Skipped
from .minijinja_runner import serve_renderer
from .mistralrs_runner import (
    BINDING_VERSION,
    HOMEPAGE,
    PRODUCT_VERSION,
    MistralRsRenderer,
    MistralRsRunner,
    NotReproduced,
    ProductRefusal,
    _debug_map,
    _part_refusal,
    tool_refusal,
)

BODY_ERROR = "Failed to deserialize the JSON body into the target type: {path}: {message}"
UNTAGGED = "data did not match any variant of untagged enum Either"
NO_CONTENT = "No content was provided, expected tool calls to be provided."
SERVER_PART_ERROR = ("Expected array content sub-content to be one of `text`, `image_url`, `audio_url`, "
                     "`video_url`, or `file`.")
MEDIA_PARTS = ("image_url", "audio_url", "video_url", "file")


def _inner_holds(value) -> bool:
    """MessageInnerContent: a string or a map of strings."""
    return isinstance(value, str) or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))


def _optional_string(message: dict, key: str) -> bool:
    return message.get(key) is None or isinstance(message[key], str)


def _tool_call_holds(call) -> bool:
    if not isinstance(call, dict) or call.get("type") != "function" or not _optional_string(call, "id"):
        return False
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return False
    keys = [k for k in ("arguments", "parameters") if k in function]
    return len(keys) == 1 and isinstance(function[keys[0]], str)


def message_holds(message) -> bool:
    """Whether serde reads `message` into the server's `Message` struct."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return False
    content = message.get("content")
    if not (content is None or isinstance(content, str) or (
            isinstance(content, list) and all(isinstance(p, dict) and all(_inner_holds(v) for v in p.values())
                                              for p in content))):
        return False
    if not all(_optional_string(message, key) for key in ("name", "tool_call_id")):
        return False
    if "reasoning_content" in message and "reasoning" in message:
        return False  # a field given twice, under its name and its alias
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if not (reasoning is None or isinstance(reasoning, str)):
        return False
    calls = message.get("tool_calls")
    return calls is None or (isinstance(calls, list) and all(_tool_call_holds(c) for c in calls))


def server_message(message: dict) -> dict:
    """One message as `parse_request` hands it to the chat-template stage."""
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    content = message.get("content")
    if content is None:
        if message.get("tool_calls") is None:
            raise ProductRefusal(NO_CONTENT)
        content = ""
    out = {"role": message["role"]}
    if isinstance(content, str):
        out["content"] = content
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if message.get("tool_calls") is not None:
            out["tool_calls"] = []
            for call in message["tool_calls"]:
                function = call["function"]
                arguments = function.get("arguments", function.get("parameters"))
                out["tool_calls"].append({"id": call.get("id") or function["name"], "type": "function",
                                          "function": {"name": function["name"], "arguments": arguments}})
        if message.get("tool_call_id") is not None:
            out["tool_call_id"] = message["tool_call_id"]
        if message.get("name") is not None:
            out["name"] = message["name"]
        return out
    if len(content) == 1 and "type" not in content[0]:
        if "text" not in content[0]:
            raise ProductRefusal("Expected `text` key in input message.")
        text = content[0]["text"]
        if isinstance(text, dict) and len(text) > 1:
            raise NotReproduced("mistral.rs prints a map `text` with Rust's HashMap order, which varies")
        out["content"] = _debug_map(text) if isinstance(text, dict) else text
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        return out
    if message["role"] != "user":
        raise ProductRefusal(f"Role for an image message must be `user`, but it is {message['role']}")
    for part in content:
        kind = part.get("type")
        if kind not in ("text", *MEDIA_PARTS):
            raise ProductRefusal(SERVER_PART_ERROR)
        refused = _part_refusal(part) if kind != "file" else None
        if refused is not None:
            raise ProductRefusal(refused)
    if any(part.get("type") in MEDIA_PARTS for part in content):
        raise NotReproduced("the server's media path (image, audio, video, file parts) is not reproduced")
    out["content"] = [{"type": "text", "text": " ".join(part["text"] for part in content)}]
    return out


def parse_tool_call_arguments(messages: list) -> None:
    """chat_template.rs:494-524: an assistant's tool-call `arguments` string replaced by the mapping it holds
    (a string that is not a JSON object stays a string)."""
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments, parse_constant=_no_constant)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed


def _no_constant(name):
    raise ValueError(name)  # serde_json reads no NaN or Infinity


def _is_gemma4(template: str) -> bool:
    return "<|tool_call>" in template and "<tool_call|>" in template


def _is_liquid(template: str) -> bool:
    return "<|tool_call_start|>" in template and "<|tool_call_end|>" in template


class MistralRsServerRenderer(MistralRsRenderer):
    name = "mistralrs-server"

    def prepare(self, request: RenderRequest):
        if not request.add_generation_prompt:
            return Skipped("mistral.rs's chat route always renders with add_generation_prompt=true")
        if request.documents is not None:
            return Skipped("mistral.rs's chat route has no documents")
        if request.continue_final_message:
            return Skipped("mistral.rs's chat route has no continue_final_message")
        for message in request.messages:
            if not message_holds(message):
                return Raised(BODY_ERROR.format(path="messages", message=UNTAGGED), RefusalKind.RENDER)
        for index, tool in enumerate(request.tools or ()):
            refused = tool_refusal(tool)
            if refused is not None:
                return Raised(BODY_ERROR.format(path=f"tools[{index}]", message=refused.split(" at line ")[0]),
                              RefusalKind.RENDER)
        try:
            messages = [server_message(m) for m in request.messages]
        except ProductRefusal as exc:
            return Raised(str(exc), RefusalKind.RENDER)
        except NotReproduced as exc:
            return Skipped(str(exc))
        if _is_gemma4(request.template) and any(m["role"] == "tool" or "tool_calls" in m for m in messages):
            return Skipped("mistral.rs's Gemma 4 tool-turn rewrite is not reproduced")
        parse_tool_call_arguments(messages)
        if _is_liquid(request.template):
            for message in messages:
                if message["role"] == "assistant" and "tool_calls" in message:
                    message["content"] = ""
        # chat_template_kwargs: only the two reasoning controls are read, each only of its own type
        kwargs = {k: v for k, v in request.kwargs.items()
                  if (k == "enable_thinking" and isinstance(v, bool))
                  or (k == "reasoning_effort" and isinstance(v, str))}
        return self.prepare_chat(request, messages, kwargs)


class MistralRsServerRunner(MistralRsRunner):
    """mistral.rs's HTTP server chat route (0.9.x) reproduced on the minijinja 2.14.0 binding in a harness."""

    module = "runners.mistralrs_server"
    runner_name = "mistralrs-server"
    imports = ("serde_shapes.py", "mistralrs_runner.py")
    binding_version = BINDING_VERSION
    product_version = PRODUCT_VERSION
    homepage = HOMEPAGE


def main() -> None:
    serve_renderer(MistralRsServerRenderer())


if __name__ == "__main__":
    main()
