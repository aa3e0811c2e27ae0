"""text-generation-inference v3.3.7's chat route (`/v1/chat/completions`), reproduced on the minijinja binding.

TGI ships as a container and a Rust binary, not as a package that can render a prompt, so every step between
the OpenAI-style request and the rendered prompt is reproduced here from TGI's source at its release tag v3.3.7
(github.com/huggingface/text-generation-inference, tag v3.3.7 = dfb3fbe7, 2025-12-18; main matches it for
this route). File:line below are at that tag.
- engine: `Cargo.lock:2542-2559` pins minijinja and minijinja-contrib 2.8.0; `Cargo.toml:35-36` asks for
  minijinja's `json` and contrib's `pycompat`, `router/Cargo.toml:51` adds `loop_controls`. minijinja's lock
  entry depends on serde and serde_json only: no `indexmap`, so no `preserve_order` (its maps are BTreeMaps)
  and no `percent-encoding` (no `urlencode`). The PyPI binding 2.8.0 cannot stand in: it has no pycompat
  callback at all (added in binding 2.9.0), which every `.items()`/`.strip()` template needs. So the runner
  renders with binding **2.9.0** and closes the 2.8 -> 2.9 gap that shows in chat templates: the binding's
  contrib filters and functions (`pluralize`, `filesizeformat`, `truncate`, `striptags`, `cycler`, `joiner`),
  `urlencode` and 2.9's `d` alias are removed from its environment (TGI's `Environment::new()` never registers
  them); `default` with a second argument (2.9's `lax`, #764) is refused with the engine's own "too many
  arguments" (engine_source); pycompat's unknown-method error loses the detail 2.9 added (#743). Maps follow
  BTreeMap order: the values bound are sorted by key (sorted_maps) and map literals with string keys are
  reordered, as are `dict(...)`'s keyword arguments (engine_source), so `tool|tojson`, `.items()`,
  `{...}|tojson` and `dict(b=1, a=2)|tojson` print sorted keys. Not closed: `dict(m, k=v)` puts a key new to
  `m` after `m`'s keys (2.8 sorts it in); map literals whose keys are not string literals keep their order; a
  pycompat method failing with an error other than "unknown method" reads "unknown method" (2.9) where 2.8
  gives that error; `with context` on imports (2.9 #759).
- environment (`router/src/infer/chat_template.rs:33-57`): `Environment::new()`, i.e. no trim_blocks, no
  lstrip_blocks, lenient undefined; `set_unknown_method_callback(pycompat::unknown_method_callback)`;
  `raise_exception(text)` failing as a syntax error ("syntax error: text", :10-12); `strftime_now(fmt)`
  (chrono local time, :15-17; here the case's frozen clock in UTC); literal source rewrites before compiling
  (:40-53): `messages[0]['content'][0]['text']` -> `messages[0]['content']`, `[::-1]` -> `|reverse`, and
  exactly `{% generation %}` / `{% endgeneration %}` removed (a whitespace-controlled `{%- generation -%}`
  stays, an unknown statement). The template is compiled once at start-up (:61-63, `unwrap`: a template that
  does not compile stops the server, so every cell is that compile refusal) by `template_from_str`, which
  names it `<string>` (minijinja 2.8.0 environment.rs:416-422), so its errors end "(in <string>:LINE)".
- the request (`router/src/lib.rs`): read by serde into `ChatRequest` (:908-925), so a body its structs cannot
  hold is answered 422 before any template runs, with axum's "Failed to deserialize the JSON body into the
  target type: <path>: <serde's message> at line 1 column C". The runner checks the same shapes
  (runners/serde_shapes.py): `Message {role, #[serde(flatten)] body: MessageBody, name: Option}` (:1233-1243),
  the untagged `MessageBody {Content {content}, Tool {tool_calls}}` (:1245-1265; content a string or a list of
  `text` / `image_url` parts, :1225-1231; a present, valid content wins over tool calls), `ToolCall {id, type,
  function}` (:1213-1218) and `Tool {type, function}` (:1194-1202), all required, and `FunctionDefinition
  {description: Option, name, arguments (alias parameters): serde_json::Value}` (:1178-1185). C counts bytes
  of the body as this runner fixes it, `{"model":"tgi","messages":...,"tools":...}` serialised compactly with
  non-ASCII kept (a client's own serialisation moves C, never the message).
- variables (`ChatTemplateInputs`, lib.rs:1204-1211; bound at chat_template.rs:109-117): messages, bos_token,
  eos_token (`none` when the model has none), add_generation_prompt always true, tools (`none` without tools).
- messages (`impl From<Message> for TextMessage`, lib.rs:1294-1319): content parts joined with "" (text
  verbatim, image_url as `![](url)`); `name` dropped; `tool_call_id` never reaches the template
  (`..Default::default()`, skipped when none, :1290-1291); a message whose body is tool calls gets `content` =
  the calls serialised compactly as {id, type, function: {description, name, arguments}}.
- `arguments` is serialised as a string (`serialize_as_string`, lib.rs:1187-1192: the value's compact JSON),
  in tool calls and in tools alike, and keeps the request's key order (serde_json is built with indexmap,
  `Cargo.lock:4252-4262`); so a tool reaches the template as {function: {arguments: "<the schema as JSON
  text>", description, name}, type} (keys sorted by the BTreeMap) and string arguments are encoded twice.
  Checked against serde itself: TGI's structs, compiled with serde 1.0.152 / serde_json 1.0.87 /
  serde_path_to_error 0.1.9, gave the texts tests/data/tgi_request_shapes.json records.
- tools (lib.rs:972-999, `router/src/infer/tool_grammar.rs:20-61`): `tool_choice` defaults to auto
  (lib.rs:1093-1094, 1129), which chains a `no_tool` function (description "Open ended response with no
  specific tool selected", arguments `{"type":"object"}`, tool_grammar.rs:34-52) onto any `tools` list, `[]`
  included; so an empty list binds `tools=[no_tool]` and gets the tool prompt. The tool prompt (TGI's default,
  lib.rs:962-964, 1071-1073) goes after "\n---\n" and, when the template's undeclared variables (nested=true,
  chat_template.rs:66-68: `tools.x` alone does not count) lack `tools`, after the tools' JSON in struct order
  (:88-96); it is appended only to a last message whose body is content, never to one of tool calls (:97-101).
- "continue final message" (chat_template.rs:120-133): when the last message is the assistant's, the rendered
  prompt is cut right after the last occurrence of its content (with any tool chunk) and trailing whitespace
  removed.

What TGI's request cannot carry is Skipped, never faked: `add_generation_prompt: false`, documents, and template
kwargs (TGI has no chat_template_kwargs). `tool_choice` and `tool_prompt` are not varied: every request is
TGI's default (auto, the default prompt).
"""
from __future__ import annotations

import json
import re

from . import serde_shapes as shapes
from .base import Raised, RefusalKind, RenderRequest, Skipped
from .minijinja_runner import BindingRunner, MiniJinjaRenderer, serve_renderer

PRODUCT_VERSION = "3.3.7"
ENGINE_VERSION = "2.8.0"   # minijinja and minijinja-contrib as TGI's Cargo.lock pins them
BINDING_VERSION = "2.9.0"  # the binding that renders: the first with contrib's pycompat callback
HOMEPAGE = "https://github.com/huggingface/text-generation-inference"
SOURCE = ("text-generation-inference v3.3.7 (dfb3fbe7): router/src/infer/chat_template.rs, router/src/lib.rs, "
          "router/src/infer/tool_grammar.rs, router/Cargo.toml, Cargo.lock (minijinja 2.8.0)")
# lib.rs:1071-1073
DEFAULT_TOOL_PROMPT = ("\nGiven the functions available, please respond with a JSON for a function call with its "
                       "proper arguments that best answers the given prompt. Respond in the format {name: function "
                       "name, parameters: dictionary of argument name and its value}.Do not use variables.\n")
# tool_grammar.rs:34-52: chained on for tool_choice auto (the default, lib.rs:1093-1094, 1129)
NO_TOOL = {"type": "function", "function": {
    "description": "Open ended response with no specific tool selected", "name": "no_tool",
    "arguments": {"type": "object"}}}
# What the binding registers and TGI's `Environment::new()` (minijinja default features + json + loop_controls,
# no contrib registration) does not have: removed from the binding's environment, so the engine itself answers
# "unknown filter" / "unknown function". `d` is minijinja 2.9.0's alias of `default`; urlencode is a feature
# TGI's build does not ask for; the rest are minijinja-contrib's `add_to_environment`.
ABSENT_FILTERS = ("d", "urlencode", "pluralize", "filesizeformat", "truncate", "striptags")
ABSENT_FUNCTIONS = ("cycler", "joiner")
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


_OPEN = {"(": ")", "[": "]", "{": "}"}
_TAG = re.compile(r"\{\{|\{%|\{#")
_RAW_START = re.compile(r"[-+]?\s*raw\s*[-+]?\Z")
_RAW_END = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_DEFAULT_CALL = re.compile(r"\|\s*default\s*\Z")
_DICT_CALL = re.compile(r"(?<![\w.])dict\s*\Z")
_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)")
_PLAIN_KEY = re.compile(r"""\s*(?:'([^'\\]*)'|"([^"\\]*)")\s*\Z""")


def _string_end(text: str, at: int) -> int:
    """The index after the string literal starting at `at` (backslash escapes skipped)."""
    quote, i = text[at], at + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


def _closing(text: str, at: int) -> int:
    """The index of the bracket closing the one at `at`, or -1 (strings and nested brackets skipped)."""
    stack, i = [], at
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _string_end(text, i)
            continue
        if c in _OPEN:
            stack.append(_OPEN[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i
        i += 1
    return -1


def _top_level(text: str, i: int = 0):
    """The indices of `text`, from `i` on, outside string literals and brackets (a closing bracket with none
    open counts as outside, so a tag's own `}}` is found)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _string_end(text, i)
            continue
        if c in _OPEN:
            depth += 1
        elif c in ")]}" and depth:
            depth -= 1
        elif not depth:
            yield i
        i += 1


def _split_top(text: str, sep: str) -> list:
    """`text` split at `sep` outside strings and brackets."""
    parts, start = [], 0
    for i in _top_level(text):
        if text[i] == sep:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _reordered(items: list, keys: list) -> list:
    """`items` (text slots) with their cores in the order of `keys` (stable: a repeated key keeps its last
    value), each slot keeping its own leading and trailing whitespace."""
    cores = [item.strip() for item in items]
    order = sorted(range(len(items)), key=lambda n: keys[n])
    out = []
    for slot, n in zip(items, order):
        lead = slot[:len(slot) - len(slot.lstrip())]
        tail = slot[len(slot.rstrip()):]
        out.append(lead + cores[n] + tail)
    return out


def _sorted_map_literal(inner: str) -> str:
    """A map literal's items in the order TGI's build keeps them: minijinja without `preserve_order` stores maps
    in a BTreeMap, so `{'name': .., 'arguments': ..}` iterates (and prints with tojson) by key. Reordered only
    when every key is a plain string literal; each item keeps its own text and the whitespace of its slot."""
    items = _split_top(inner, ",")
    trailing = None  # the whitespace after a trailing comma
    if len(items) > 1 and not items[-1].strip():
        trailing = items.pop()
    keys = []
    for item in items:
        pair = _split_top(item, ":")
        found = _PLAIN_KEY.match(pair[0]) if len(pair) >= 2 else None
        if found is None:
            return inner
        keys.append(found.group(1) if found.group(1) is not None else found.group(2))
    return ",".join(_reordered(items, keys)) + ("" if trailing is None else "," + trailing)


def _sorted_keywords(inner: str) -> str:
    """A `dict(...)` call's keyword arguments in key order: minijinja 2.8.0's `dict` collects them into a
    BTreeMap (functions.rs:356-378, `ValueMap` at value/mod.rs:243-244 without `preserve_order`), so
    `dict(b=1, a=2)` iterates a, b; the binding's IndexMap keeps call order. Only the keyword arguments move
    (they follow any positional one), each keeping the whitespace of its slot."""
    args = _split_top(inner, ",")
    trailing = None
    if len(args) > 1 and not args[-1].strip():
        trailing = args.pop()
    first = next((n for n, arg in enumerate(args) if _KEYWORD.match(arg)), len(args))
    keys = [_KEYWORD.match(arg) for arg in args[first:]]
    if len(keys) < 2 or not all(keys):
        return inner
    moved = _reordered(args[first:], [key.group(1) for key in keys])
    return ",".join(args[:first] + moved) + ("" if trailing is None else "," + trailing)


def _rewrite_expression(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
            continue
        if c in _OPEN:
            end = _closing(text, i)
            if end == -1:
                out.append(text[i:])
                break
            inner = _rewrite_expression(text[i + 1:end])
            if c == "{":
                inner = _sorted_map_literal(inner)
            elif c == "(" and _DICT_CALL.search("".join(out)):
                inner = _sorted_keywords(inner)
            elif c == "(" and _DEFAULT_CALL.search("".join(out)):
                args = _split_top(inner, ",")
                if len(args) >= 2 and args[-1].strip():
                    # minijinja 2.8.0's `default(value, other)` takes one argument, 2.9.0's a second (`lax`): the
                    # same arguments behind two `none`s fail in the binding with the engine's own "too many
                    # arguments", after every argument is evaluated, as in TGI
                    inner = args[0] + ", none, none," + ",".join(args[1:])
            out.append(c + inner + text[end])
            i = end + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def engine_source(source: str) -> str:
    """The template, rewritten so the binding (minijinja 2.9.0, preserve_order) renders what minijinja 2.8.0 as
    TGI builds it renders: map literals in key order, `default` with a second argument refused. Only the
    expressions inside `{{ }}` and `{% %}` tags are touched (comments and raw blocks are left alone)."""
    out, i = [], 0
    while True:
        found = _TAG.search(source, i)
        if found is None:
            out.append(source[i:])
            return "".join(out)
        start = found.end()
        out.append(source[i:start])
        if found.group() == "{#":
            end = source.find("#}", start)
            end = len(source) if end == -1 else end
            out.append(source[start:end])
            i = end
            continue
        closer = "}}" if found.group() == "{{" else "%}"
        j = next((j for j in _top_level(source, start) if source.startswith(closer, j)), len(source))
        body = source[start:j]
        if closer == "%}" and _RAW_START.match(body.strip()):
            raw_end = _RAW_END.search(source, j)
            stop = len(source) if raw_end is None else raw_end.start()
            out.append(source[start:stop])
            i = stop
            continue
        out.append(_rewrite_expression(body))
        i = j


def sorted_maps(value):
    """JSON data with every map's keys in BTreeMap order: TGI's minijinja is built without `preserve_order`
    (Cargo.lock: minijinja 2.8.0 depends on serde and serde_json only, no indexmap), so the maps serde hands it
    iterate by key, while the binding keeps the order it is given."""
    if isinstance(value, dict):
        return {key: sorted_maps(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_maps(item) for item in value]
    return value


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


_UNKNOWN_METHOD = re.compile(r"\Aunknown method: \w+ has no method named \w+")


class TGIRenderer(MiniJinjaRenderer):
    name = "tgi"
    homepage = HOMEPAGE
    raise_format = "syntax error: {message}"  # chat_template.rs:10-12
    template_name = "<string>"  # chat_template.rs:61-63 template_from_str (minijinja environment.rs:420-421)

    def __init__(self):
        super().__init__()
        for name in ABSENT_FILTERS:
            self.env.remove_filter(name)
        for name in ABSENT_FUNCTIONS:
            self.env.remove_global(name)

    def environment_options(self) -> dict:
        options = super().environment_options()
        options.update(trim_blocks=False, lstrip_blocks=False)  # chat_template.rs:33 Environment::new()
        return options

    def info(self) -> dict:
        return dict(super().info(), version=PRODUCT_VERSION, engine=f"minijinja {ENGINE_VERSION} (binding "
                    f"{self.version})", source=SOURCE)

    def _uses_tools(self, source: str) -> bool:
        # chat_template.rs:66-68: `undeclared_variables(true)`, so `tools.x` alone is "tools.x", not "tools"
        try:
            return "tools" in self.env.undeclared_variables_in_str(source, nested=True)
        except Exception:  # the compile refusal is reported by render
            return False

    def prepare(self, request: RenderRequest):
        if not request.add_generation_prompt:
            return Skipped("TGI's chat route always renders with add_generation_prompt=true")
        if request.documents is not None:
            return Skipped("TGI's chat route has no documents")
        if request.kwargs:
            return Skipped(f"TGI's chat route cannot pass template variables {', '.join(sorted(request.kwargs))}")
        source = request.template
        for old, new in REWRITES:  # chat_template.rs:40-53
            source = source.replace(old, new)
        refused = rejection(request_body(request))
        if refused is not None:
            return Raised(refused, RefusalKind.RENDER)
        messages = [text_message(m) for m in request.messages]
        tools = None
        if request.tools is not None:
            # lib.rs:984-991 and tool_grammar.rs:29-61: with tool_choice auto any list, `[]` included, gets
            # no_tool chained on, so it is never empty and the tool prompt is always appended
            tools = [tgi_tool(t) for t in request.tools] + [tgi_tool(NO_TOOL)]
            # chat_template.rs:88-96: the template's undeclared variables decide whether the tools' JSON goes too
            chunk = ("\n---\n" + DEFAULT_TOOL_PROMPT if self._uses_tools(source)
                     else "\n---\n" + compact(tools) + "\n" + DEFAULT_TOOL_PROMPT)
            # chat_template.rs:97-101: only onto a last message whose body is content, never tool calls
            if messages and shapes.holds(_CONTENT_BODY, request.messages[-1]):
                messages[-1]["content"] += chunk
        self._final = dict(messages[-1]) if messages else None  # after the tool chunk, as chat_template.rs:108
        context = {"messages": sorted_maps(messages), "bos_token": request.bos_token,
                   "eos_token": request.eos_token, "add_generation_prompt": True, "tools": sorted_maps(tools)}
        return engine_source(source), context

    def render(self, request: RenderRequest):
        outcome = super().render(request)
        if isinstance(outcome, Raised) and _UNKNOWN_METHOD.match(outcome.message):
            # minijinja 2.8.0 returns pycompat's own UnknownMethod error, which has no detail; 2.9.0 (#743) adds
            # "<kind> has no method named <name>"
            return Raised(_UNKNOWN_METHOD.sub("unknown method", outcome.message, count=1), outcome.refusal)
        return outcome

    def finish(self, text: str, request: RenderRequest) -> str:
        # chat_template.rs:120-133: after a final assistant message, cut after its last occurrence
        last = self._final
        if last and last["role"] == "assistant":
            content = last["content"]
            at = text.rfind(content)
            if at != -1:
                return text[:at + len(content)].rstrip()
        return text


class TGIRunner(BindingRunner):
    """TGI v3.3.7's chat-template stage, reproduced on the minijinja 2.9.0 binding in a harness process."""

    homepage = HOMEPAGE
    module = "runners.tgi_runner"
    runner_name = "tgi"
    imports = ("serde_shapes.py",)
    binding_version = BINDING_VERSION
    product_version = PRODUCT_VERSION


def main() -> None:
    serve_renderer(TGIRenderer())


if __name__ == "__main__":
    main()
