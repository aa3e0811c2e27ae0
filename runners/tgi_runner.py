"""text-generation-inference's chat route (`/v1/chat/completions`, router v3.x), reproduced on the minijinja binding.

TGI ships as a container and a Rust binary, not as a package that can render a prompt, so every step between
the OpenAI-style request and the rendered prompt is reproduced here, from TGI's source
(github.com/huggingface/text-generation-inference):
- engine: TGI locks minijinja 2.7.0 and minijinja-contrib 2.7.0 (`Cargo.lock` @00ee4fb250adcf9355a5521da775b6d8834f515d,
  workspace 3.1.1-dev0; `Cargo.toml` asks for minijinja's `json` feature, `loop_controls` since PR #2998, and
  contrib's `pycompat`). The PyPI
  binding 2.7.0 has no switch for contrib's unknown-method callback (it arrived in binding 2.9.0), so the runner
  renders with binding **2.9.0**, the nearest release that has it: the 2.7 -> 2.9 engine changes are the
  known approximation.
- environment (`router/src/infer/chat_template.rs` @0275c52cbdfb3ce619d9cf7323e5acc41027bbe7 and
  @058162685f0531edb4c566151eb68c490ebe8267): `Environment::new()`, i.e. no trim_blocks, no lstrip_blocks,
  lenient undefined; `set_unknown_method_callback(pycompat::unknown_method_callback)`;
  `raise_exception(text)` failing as a syntax error ("syntax error: text"); the template compiled once at
  start-up (a template that does not compile stops the server: every cell is that compile refusal).
  `{% break %}`/`{% continue %}` render: TGI PR #2998 (merged February 2025, before the v3.x changes below)
  turned on minijinja's `loop_controls` feature. The binding's `urlencode`, a feature TGI's build does not
  ask for, is refused as TGI refuses it.
- v3.x additions (TGI PR #3204 and the Qwen3/Gemma 3 fixes, read from excerpts of chat_template.rs, not at a
  tagged commit): `strftime_now(fmt)` (chrono, local time; here the case's frozen clock in UTC); literal
  source rewrites before compiling: `messages[0]['content'][0]['text']` -> `messages[0]['content']`,
  `[::-1]` -> `|reverse`, and exactly `{% generation %}` / `{% endgeneration %}` removed (a
  whitespace-controlled `{%- generation -%}` is not matched, so it stays an unknown statement).
- the request (`router/src/lib.rs` @1b374af6959705ee2912cf839bc83cd159c0860c, a v3.x commit): read by serde
  into `ChatRequest`, so a body its structs cannot hold is answered 422 before any template runs, with axum's
  "Failed to deserialize the JSON body into the target type: <path>: <serde's message> at line 1 column C".
  The runner checks the same shapes (runners/serde_shapes.py): `Message {role: String, #[serde(flatten)] body:
  MessageBody, name: Option<String>}`, the untagged `MessageBody {Content {content}, Tool {tool_calls}}`
  (content a string or a list of `text` / `image_url` parts; a present, valid content wins over tool calls),
  `ToolCall {id, type, function}` and `Tool {type, function}`, all required, and `FunctionDefinition
  {description: Option, name, arguments (alias parameters): serde_json::Value, required}`. C counts bytes of
  the body as this runner fixes it, `{"model":"tgi","messages":...,"tools":...}` serialised compactly with
  non-ASCII kept (a client's own serialisation moves C, never the message).
- variables (`ChatTemplateInputs`): messages, bos_token, eos_token (`none` when the model has none),
  add_generation_prompt always true, tools (`none` without tools).
- messages (`impl From<Message> for TextMessage`): content parts joined with "" (text verbatim, image_url as
  `![](url)`); `name` dropped; `tool_call_id` never reaches the template (`..Default::default()`, skipped
  when none); a message whose body is tool calls gets `content` = the calls serialised compactly as {id, type,
  function: {description, name, arguments}}.
- `arguments` is serialised as a string (`serialize_as_string`: the value's compact JSON), in tool calls and
  in tools alike: a tool reaches the template as {type, function: {description, name, arguments: "<the schema
  as JSON text>"}}, and string arguments are encoded twice. Checked against serde itself: TGI's structs,
  compiled with serde 1.0.152 / serde_json 1.0.87 / serde_path_to_error 0.1.9, gave the texts
  tests/data/tgi_request_shapes.json records.
- tools (`chat_template.rs` `apply` and `router/src/infer/tool_grammar.rs` @f213012b08346a3bfc56d96cc2b53bd67ba340d8):
  a `no_tool` function is appended; the tool prompt (TGI's default) is appended to the last message,
  after "\n---\n" and, when the template does not use `tools`, after the tools' JSON as well.
- v3.x "continue final message": when the last message is the assistant's, the rendered prompt is cut right
  after the last occurrence of its content and trailing whitespace removed.

What TGI's request cannot carry is Skipped, never faked: `add_generation_prompt: false`, documents, and template
kwargs (TGI has no chat_template_kwargs). Known uncertainties, not checkable without a TGI binary: whether an
empty `tools` list injects the tool prompt (treated as no tools), and whether JSON maps keep their order
(kept; `arguments` texts are written with the request's key order).
"""
from __future__ import annotations

import json

from . import serde_shapes as shapes
from .base import Raised, RefusalKind, RenderRequest, Skipped
from .minijinja_runner import BindingRunner, MiniJinjaRenderer, serve_renderer
from .mistralrs_runner import no_urlencode

PRODUCT_VERSION = "3.x"
BINDING_VERSION = "2.9.0"
HOMEPAGE = "https://github.com/huggingface/text-generation-inference"
SOURCE = ("router/src/infer/chat_template.rs @0275c52cbdfb3ce619d9cf7323e5acc41027bbe7, "
          "router/src/lib.rs @1b374af6959705ee2912cf839bc83cd159c0860c, "
          "router/src/infer/tool_grammar.rs @f213012b08346a3bfc56d96cc2b53bd67ba340d8, Cargo.lock @00ee4fb250ad")
DEFAULT_TOOL_PROMPT = ("\nGiven the functions available, please respond with a JSON for a function call with its "
                       "proper arguments that best answers the given prompt. Respond in the format {name: function "
                       "name, parameters: dictionary of argument name and its value}.Do not use variables.\n")
NO_TOOL = {"type": "function", "function": {
    "description": "Open ened response with no specific tool selected", "name": "no_tool",
    "arguments": {"type": "object", "properties": {"content": {"type": "string", "description": "The response content"}},
                  "required": ["content"]}}}
REWRITES = (("messages[0]['content'][0]['text']", "messages[0]['content']"), ("[::-1]", "|reverse"),
            ("{% generation %}", ""), ("{% endgeneration %}", ""))
REJECTED = "Failed to deserialize the JSON body into the target type: "

# The request structs of router/src/lib.rs @1b374af6, with the serde attributes that decide what is refused.
_FUNCTION = shapes.Struct("FunctionDefinition", [
    shapes.Field("description", shapes.Str(nullable=True), required=False), shapes.Field("name", shapes.Str()),
    shapes.Field("arguments", shapes.Any_(), aliases=("parameters",))])
_TOOL = shapes.Struct("Tool", [shapes.Field("type", shapes.Str()), shapes.Field("function", _FUNCTION)])
_TOOL_CALL = shapes.Struct("ToolCall", [shapes.Field("id", shapes.Str()), shapes.Field("type", shapes.Str()),
                                        shapes.Field("function", _FUNCTION)])
_CHUNK = shapes.Tagged("type", {
    "text": shapes.Struct("Text", [shapes.Field("text", shapes.Str())]),
    "image_url": shapes.Struct("ImageUrl", [shapes.Field("image_url", shapes.Struct("Url", [
        shapes.Field("url", shapes.Str())]))])})
_CONTENT_BODY = shapes.Struct("Content", [shapes.Field("content", shapes.OneOf([shapes.Str(), shapes.Seq(_CHUNK)]))])
_BODY = shapes.Untagged("MessageBody", [_CONTENT_BODY, shapes.Struct("Tool", [
    shapes.Field("tool_calls", shapes.Seq(_TOOL_CALL))])])
_MESSAGE = shapes.Struct("Message", [shapes.Field("role", shapes.Str()),
                                     shapes.Field("name", shapes.Str(nullable=True), required=False)], flatten=_BODY)
REQUEST = shapes.Struct("ChatRequest", [
    shapes.Field("model", shapes.Str(nullable=True), required=False), shapes.Field("messages", shapes.Seq(_MESSAGE)),
    shapes.Field("tools", shapes.Seq(_TOOL, nullable=True), required=False)])


def request_body(request: RenderRequest) -> dict:
    """The chat request as this runner posts it (the order of its keys fixes serde's error columns)."""
    body = {"model": "tgi", "messages": request.messages}
    if request.tools is not None:
        body["tools"] = request.tools
    return body


def rejection(body: dict):
    """TGI's 422 for a body its structs cannot hold, or None."""
    error = shapes.first_error(REQUEST, body, separators=(",", ":"), ensure_ascii=False)
    return None if error is None else REJECTED + error.text(with_path=True)


def compact(value) -> str:
    """serde_json::to_string: no spaces, non-ASCII as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tgi_function(function: dict) -> dict:
    """A FunctionDefinition as it serialises: `arguments` (or its alias `parameters`) as its own JSON text."""
    arguments = function["arguments"] if "arguments" in function else function["parameters"]
    return {"description": function.get("description"), "name": function["name"], "arguments": compact(arguments)}


def tgi_tool(tool: dict) -> dict:
    return {"type": tool["type"], "function": tgi_function(tool["function"])}


def tgi_tool_call(call: dict) -> dict:
    return {"id": call["id"], "type": call["type"], "function": tgi_function(call["function"])}


def text_message(message: dict) -> dict:
    """TGI's TextMessage for one request message the request structs hold."""
    if shapes.holds(_CONTENT_BODY, message):
        content = message["content"]
        if isinstance(content, list):
            content = "".join(part["text"] if part["type"] == "text" else f"![]({part['image_url']['url']})"
                              for part in content)
    else:
        content = compact([tgi_tool_call(call) for call in message["tool_calls"]])
    return {"role": message["role"], "content": content}


class TGIRenderer(MiniJinjaRenderer):
    name = "tgi"
    homepage = HOMEPAGE
    raise_format = "syntax error: {message}"

    def environment_options(self) -> dict:
        options = super().environment_options()
        options.update(trim_blocks=False, lstrip_blocks=False, filters={"urlencode": no_urlencode})
        return options

    def info(self) -> dict:
        return dict(super().info(), version=PRODUCT_VERSION, engine=f"minijinja {self.version}", source=SOURCE)

    def _uses_tools(self, source: str) -> bool:
        finder = getattr(self.env, "undeclared_variables_in_str", None)
        if finder is None:
            return "tools" in source
        try:
            return "tools" in finder(source)
        except Exception:  # the compile refusal is reported by render
            return "tools" in source

    def prepare(self, request: RenderRequest):
        if not request.add_generation_prompt:
            return Skipped("TGI's chat route always renders with add_generation_prompt=true")
        if request.documents is not None:
            return Skipped("TGI's chat route has no documents")
        if request.kwargs:
            return Skipped(f"TGI's chat route cannot pass template variables {', '.join(sorted(request.kwargs))}")
        source = request.template
        for old, new in REWRITES:
            source = source.replace(old, new)
        refused = rejection(request_body(request))
        if refused is not None:
            return Raised(refused, RefusalKind.RENDER)
        messages = [text_message(m) for m in request.messages]
        tools = None
        if request.tools:
            tools = [tgi_tool(t) for t in request.tools] + [tgi_tool(NO_TOOL)]
            chunk = ("\n---\n" + DEFAULT_TOOL_PROMPT if self._uses_tools(source)
                     else "\n---\n" + compact(tools) + "\n" + DEFAULT_TOOL_PROMPT)
            if messages:
                messages[-1]["content"] += chunk
        context = {"messages": messages, "bos_token": request.bos_token, "eos_token": request.eos_token,
                   "add_generation_prompt": True, "tools": tools}
        return source, context

    def finish(self, text: str, request: RenderRequest) -> str:
        last = request.messages[-1] if request.messages else None
        if last and last.get("role") == "assistant":
            content = text_message(last)["content"]
            at = text.rfind(content)
            if at != -1:
                return text[:at + len(content)].rstrip()
        return text


class TGIRunner(BindingRunner):
    """TGI v3.x's chat-template stage, reproduced on the minijinja 2.9.0 binding in a harness process."""

    homepage = HOMEPAGE
    module = "runners.tgi_runner"
    runner_name = "tgi"
    imports = ("mistralrs_runner.py", "serde_shapes.py")
    binding_version = BINDING_VERSION
    product_version = PRODUCT_VERSION


def main() -> None:
    serve_renderer(TGIRenderer())


if __name__ == "__main__":
    main()
