"""SGLang's gateway (its Rust router, PyPI `sglang-router` 0.3.2) as it renders a chat request, reproduced.

The route: the gateway's gRPC mode, where the router itself applies the chat template before it tokenizes and
sends token ids to the SGLang workers (`/v1/chat/completions` through the regular gRPC pipeline). SGLang's
Python server (`python -m sglang.launch_server`) renders elsewhere, with vLLM's chat layer and transformers;
that route is not this runner. Source: the `sglang-router` 0.3.2 sdist from PyPI (the release's own source,
crate `sgl-model-gateway` 0.3.2), cited below as FILE:LINE of that sdist; the GitHub repository's tags could not
be listed here (its snapshot is larger than the reading tool brings), so the registry's release stands in.

- the engine: MiniJinja 2.14.0 and minijinja-contrib 2.14.0 (the crate versions embedded in the 0.3.2 wheel's
  extension module; the sdist ships no Cargo.lock), with features `builtins`, `json` and `unstable_machinery`
  (Cargo.toml:85-86): no `loop_controls` (`{% break %}`/`{% continue %}` do not parse), no `urlencode`, and
  no `preserve_order` (the gateway's lock gives minijinja no indexmap), so every map is a BTreeMap: keys
  iterate, print and serialise **sorted**. Rendered here on the `minijinja` binding 2.14.0 from PyPI, the
  same engine release, its data handed over with keys sorted; maps a template builds itself keep insertion
  order in the binding (the known approximation; `tojson` sorts them as the product does).
- the environment (src/tokenizer/chat_template.rs:473-485): `Environment::new()` (no trim_blocks, no
  lstrip_blocks, lenient undefined), the template added as "chat", pycompat's unknown-method callback, and
  one filter of its own, `tojson` (lines 365-433): `ensure_ascii` and `separators` read and ignored,
  `indent` (negative: "indent cannot be negative"), `sort_keys`, any other keyword an error; the JSON is
  serde_json's (compact "," and ":", no HTML escaping, non-ASCII kept, serde_json's float spelling). No
  `raise_exception`, no `strftime_now`: a template calling them fails as an unknown function. The binding's
  contrib extras the product does not register (truncate, striptags, pluralize, filesizeformat, cycler,
  joiner) are refused as unknown.
- the variables (chat_template.rs:495-508): `messages`, `add_generation_prompt` (always true:
  src/routers/grpc/utils.rs:467), `tools` (`none` without tools), `documents` (always `none`: the chat request
  has none), then the request's `chat_template_kwargs` (and `reasoning_effort`, utils.rs:445-457) merged
  behind them, so a kwarg never replaces those four. No bos_token, eos_token or other special tokens.
- the request (src/protocols/chat.rs:27-75, common.rs:179-198 and 379-417): read by serde into `ChatMessage`,
  tagged by `role` (system, user, assistant, tool, function, developer; any other role refused), each variant
  keeping only its own fields (a tool message keeps `content` and `tool_call_id`, not `name`; an assistant's
  `content: null` is dropped), content a string or a list of text / image_url / video_url parts, tool calls
  `{id, type, function: {name, arguments}}` with `arguments` a string or null; tools `{type, function: {name,
  description?, parameters, strict?}}` with `parameters` required. A user message with empty content is
  refused by validation (chat.rs:369-390). Refusals carry serde's or the validator's words; serde's "at line 1
  column C" position is not reproduced.
- the messages, as the router prepares them (utils.rs:124-230, 399-500): each re-serialised from its struct;
  a list content made a string of its text parts joined with " " (when it has any) for a template whose
  content format is "string", or kept as parts, media parts replaced by `{"type": "image"}` / video / audio,
  for an "openai" one (the format detected by walking the template's AST, chat_template.rs:40-345: reproduced
  here on Jinja2's parser, node for node); an assistant's tool-call `arguments` parsed as JSON (text that does
  not parse refuses the request); `continue_final_message` with a final assistant message pops it and appends
  its content, when a string, to the rendered prompt.

Not reproduced, Skipped saying so: `add_generation_prompt: false` without continue_final_message (the chat
route cannot ask for it) and documents (the chat request has none). The Harmony pipeline the gateway uses
for gpt-oss models instead of their template is not this runner.

No registry package renders a prompt here for an independent check: the `sglang-router` wheel renders only on
the way to a gRPC worker (see docs/engines.md).
"""
from __future__ import annotations

import json
import sys
from typing import Optional

from .base import Raised, RefusalKind, RenderRequest, Skipped
from .minijinja_runner import BindingRunner, MiniJinjaRenderer, serve_renderer, with_own_tojson
from .mistralrs_runner import ProductRefusal, _ryu_floats, _RYU_MARK, loop_control_refusal, no_urlencode
from .serde_shapes import _unexpected

PRODUCT_VERSION = "0.3.2"
BINDING_VERSION = "2.14.0"
HOMEPAGE = "https://github.com/sgl-project/sglang"
SOURCE = "sglang-router 0.3.2 sdist (PyPI): src/tokenizer/chat_template.rs, src/routers/grpc/utils.rs"
# The harness also parses templates with Jinja2 (the content-format detector); both pinned in one environment.
REQUIREMENTS = [f"minijinja=={BINDING_VERSION}", "jinja2==3.1.6"]
TOJSON_FILTER = "chatgold_sglang_tojson"
TEMPLATE_NAME = "chat"
ROLES = ("system", "user", "assistant", "tool", "function", "developer")
CONTRIB_FILTERS = ("truncate", "striptags", "pluralize", "filesizeformat")
CONTRIB_FUNCTIONS = ("cycler", "joiner")
# axum's Json rejection as the gateway's ValidatedJson words it (src/protocols/validated.rs:51-58).
BODY_ERROR = "Invalid JSON data: Failed to deserialize the JSON body into the target type: {path}: {message}"


class RequestRefused(Exception):
    """The gateway refuses the request before any template runs (HTTP 400), with this message."""


def _sorted_maps(value):
    """Data as MiniJinja without preserve_order holds it: every map's keys in sorted order."""
    if isinstance(value, dict):
        return {k: _sorted_maps(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_maps(v) for v in value]
    return value


# -- the request as serde reads it (protocols/chat.rs, protocols/common.rs) ----------------------------------
def _body_error(path: str, message: str) -> RequestRefused:
    return RequestRefused(BODY_ERROR.format(path=path, message=message))


def _wrong(value, expected: str) -> str:
    return f"invalid type: {_unexpected(value)}, expected {expected}"


def _string(obj: dict, key: str, path: str, required: bool = True, nullable: bool = False) -> Optional[str]:
    if key not in obj:
        if required:
            raise _body_error(path, f"missing field `{key}`")
        return None
    value = obj[key]
    if value is None and (nullable or not required):
        return None
    if not isinstance(value, str):
        raise _body_error(path, _wrong(value, "a string"))
    return value


def _part(part) -> Optional[dict]:
    """A ContentPart (`#[serde(tag = "type")]`: text {text}, image_url {image_url: {url, detail?}}, video_url
    {video_url: {url}}) re-serialised, or None when the data is none of them."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind in ("image_url", "video_url"):
        url = part.get(kind)
        if not (isinstance(url, dict) and isinstance(url.get("url"), str)):
            return None
        out = {"url": url["url"]}
        if kind == "image_url" and url.get("detail") is not None:
            if not isinstance(url["detail"], str):
                return None
            out["detail"] = url["detail"]
        return {"type": kind, kind: out}
    return None


def _content(value, path: str):
    """MessageContent, `#[serde(untagged)]`: a string, or a list of ContentParts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [_part(p) for p in value]
        if all(p is not None for p in parts):
            return parts
    raise _body_error(path, "data did not match any variant of untagged enum MessageContent")


def _tool_call(call, path: str) -> dict:
    if not isinstance(call, dict):
        raise _body_error(path, _wrong(call, "struct ToolCall"))
    call_id = _string(call, "id", path)
    kind = _string(call, "type", path)
    if "function" not in call:
        raise _body_error(path, "missing field `function`")
    function = call["function"]
    if not isinstance(function, dict):
        raise _body_error(path, _wrong(function, "struct FunctionCallResponse"))
    name = _string(function, "name", path)
    arguments = _string(function, "arguments", path, required=False, nullable=True)
    return {"id": call_id, "type": kind, "function": {"name": name, "arguments": arguments}}


def tool_value(tool, path: str) -> dict:
    """A `Tool {type: String, function: Function {name, description?, parameters: Value, strict?}}` as the
    router serialises it again (common.rs:379-394): unknown keys dropped, absent options left out."""
    if not isinstance(tool, dict):
        raise _body_error(path, _wrong(tool, "struct Tool"))
    kind = _string(tool, "type", path)
    if "function" not in tool:
        raise _body_error(path, "missing field `function`")
    function = tool["function"]
    if not isinstance(function, dict):
        raise _body_error(path + ".function", _wrong(function, "struct Function"))
    out = {"name": _string(function, "name", path + ".function")}
    description = _string(function, "description", path + ".function", required=False)
    if description is not None:
        out["description"] = description
    if "parameters" not in function:
        raise _body_error(path + ".function", "missing field `parameters`")
    out["parameters"] = function["parameters"]
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise _body_error(path + ".function", _wrong(strict, "a boolean"))
        out["strict"] = strict
    return {"type": kind, "function": out}


def message_value(message, index: int) -> dict:
    """One message read as `ChatMessage` (tagged by role) and serialised back (chat.rs:25-66): only its
    variant's fields, `None` options left out."""
    path = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _body_error(path, _wrong(message, "internally tagged enum ChatMessage"))
    if "role" not in message:
        raise _body_error(path, "missing field `role`")
    role = message["role"]
    if not isinstance(role, str) or role not in ROLES:
        expected = ", ".join(f"`{r}`" for r in ROLES)
        shown = f"`{role}`" if isinstance(role, str) else None
        raise _body_error(path, f"unknown variant {shown}, expected one of {expected}" if shown
                          else _wrong(role, "variant identifier"))
    out = {"role": role}
    if role in ("system", "user", "tool", "developer"):
        if "content" not in message:
            raise _body_error(path, "missing field `content`")
        out["content"] = _content(message["content"], path)
    if role in ("system", "user", "developer"):
        name = _string(message, "name", path, required=False)
        if name is not None:
            out["name"] = name
    if role == "developer" and message.get("tools") is not None:
        if not isinstance(message["tools"], list):
            raise _body_error(path, _wrong(message["tools"], "a sequence"))
        out["tools"] = [tool_value(t, f"{path}.tools[{i}]") for i, t in enumerate(message["tools"])]
    if role == "tool":
        out["tool_call_id"] = _string(message, "tool_call_id", path)
    if role == "function":
        out["content"] = _string(message, "content", path)
        out["name"] = _string(message, "name", path)
    if role == "assistant":
        if message.get("content") is not None:
            out["content"] = _content(message["content"], path)
        name = _string(message, "name", path, required=False)
        if name is not None:
            out["name"] = name
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _body_error(path, _wrong(calls, "a sequence"))
            out["tool_calls"] = [_tool_call(c, path) for c in calls]
        reasoning = _string(message, "reasoning_content", path, required=False)
        if reasoning is not None:
            out["reasoning_content"] = reasoning
    return out


def validation_refusal(messages: list) -> Optional[str]:
    """chat.rs:369-390 `validate_messages`, as validator's ValidationErrors print it."""
    if not messages:
        return "messages: Validation error: messages cannot be empty"
    for message in messages:
        if message["role"] == "user" and message["content"] in ("", []):
            kind = "message content cannot be empty" if message["content"] == "" else \
                "message content parts cannot be empty"
            return f"messages: Validation error: {kind}"
    return None


# -- the router's preparation (routers/grpc/utils.rs) ---------------------------------------------------------
def transform_content(content, openai: bool):
    """utils.rs:184-230 `transform_content_field`."""
    if not isinstance(content, list):
        return content
    if not openai:
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(p.get("text"), str)]
        return " ".join(texts) if texts else content
    media = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
    return [{"type": media[p["type"]]} if isinstance(p, dict) and p.get("type") in media else p for p in content]


def _serde_json_loads(text: str):
    """serde_json::from_str::<Value>: strict JSON (no NaN/Infinity)."""
    def refuse(name):
        raise ValueError(name)
    return json.loads(text, parse_constant=refuse)


def parse_tool_call_arguments(messages: list) -> None:
    """utils.rs:124-159: an assistant's tool-call `arguments` string parsed as JSON, in place."""
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
            continue
        for call in message["tool_calls"]:
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                continue
            text = function["arguments"]
            try:
                function["arguments"] = _serde_json_loads(text)
            except ValueError:
                # the product appends serde_json's own error text, which is not reproduced
                raise RequestRefused(f"Failed to parse tool call arguments as JSON: '{text}'") from None


# -- the content-format detector (tokenizer/chat_template.rs:40-345), on Jinja2's AST ----------------------
class _Detector:
    """MiniJinja's AST as SGLang's detector walks it, read off Jinja2's nodes: ForLoop = For, IfCond = If (an
    elif is a nested IfCond in the false branch), EmitExpr = each expression of an Output, Set = Assign,
    Macro = Macro; Var/GetAttr/GetItem/Filter/Test/Const = Name/Getattr/Getitem/Filter/Test/Const; BinOp =
    the binary nodes, And/Or and one Compare; UnaryOp = Not/Neg/Pos."""

    def __init__(self):
        from jinja2 import nodes

        self.n = nodes
        self.scope: list = []
        self.openai = False

    def _var(self, expr, name) -> bool:
        return isinstance(expr, self.n.Name) and expr.name == name

    def _const_str(self, expr, value) -> bool:
        return isinstance(expr, self.n.Const) and expr.value == value

    def _numeric(self, expr) -> bool:
        return isinstance(expr, self.n.Const) and type(expr.value) in (int, float)

    def _var_dot_content(self, expr, name) -> bool:
        n = self.n
        if isinstance(expr, n.Getattr):
            return self._var(expr.node, name) and expr.attr == "content"
        if isinstance(expr, n.Getitem):
            return self._var(expr.node, name) and self._const_str(expr.arg, "content")
        if isinstance(expr, n.Filter):
            return expr.node is not None and self._var_dot_content(expr.node, name)
        if isinstance(expr, n.Test):
            return self._var_dot_content(expr.node, name)
        return False

    def _scope_content(self, expr) -> bool:
        n = self.n
        while True:
            if any(self._var_dot_content(expr, v) for v in set(self.scope)):
                return True
            if isinstance(expr, (n.Getattr, n.Getitem)):
                expr = expr.node
            else:
                return False

    def walk(self, stmts) -> None:
        n = self.n
        for stmt in stmts:
            if self.openai:
                return
            if isinstance(stmt, n.Template):
                self.walk(stmt.body)
            elif isinstance(stmt, n.For):
                pushed = self._var(stmt.iter, "messages") and isinstance(stmt.target, n.Name)
                if pushed:
                    self.scope.append(stmt.target.name)
                if self._scope_content(stmt.iter) or self._var(stmt.iter, "content"):
                    self.openai = True
                self.walk(stmt.body)
                if pushed:
                    self.scope.pop()
            elif isinstance(stmt, n.If):
                self._if(stmt.test, stmt.body, list(stmt.elif_), stmt.else_)
            elif isinstance(stmt, n.Output):
                for expr in stmt.nodes:
                    if not isinstance(expr, n.TemplateData):
                        self.inspect(expr)
                        if self.openai:
                            return
            elif isinstance(stmt, n.Assign):
                if self._var(stmt.target, "content") and self._scope_content(stmt.node):
                    self.openai = True
            elif isinstance(stmt, n.Macro):
                found = {"test": False, "loop": False}
                self._scan_macro(stmt.body, found)
                if found["test"] and found["loop"]:
                    self.openai = True

    def _if(self, test, body, elifs, else_) -> None:
        self.inspect(test)
        self.walk(body)
        if elifs:
            first = elifs[0]
            if not self.openai:
                self._if(first.test, first.body, elifs[1:], else_)
        else:
            self.walk(else_)

    def inspect(self, expr) -> None:
        n = self.n
        if self.openai or expr is None:
            return
        if isinstance(expr, n.Getitem):
            if (self._var(expr.node, "content") or self._scope_content(expr.node)) and self._numeric(expr.arg):
                self.openai = True
        elif isinstance(expr, n.Filter):
            if expr.name == "length":
                if expr.node is not None and (self._var(expr.node, "content") or self._scope_content(expr.node)):
                    self.openai = True
            else:
                self.inspect(expr.node)
        elif isinstance(expr, n.Test):
            if expr.name in ("sequence", "iterable", "string"):
                if self._var(expr.node, "content") or self._scope_content(expr.node):
                    self.openai = True
            else:
                self.inspect(expr.node)
        elif isinstance(expr, n.Getattr):
            self.inspect(expr.node)
        elif isinstance(expr, n.Compare):
            self.inspect(expr.expr)
            for operand in expr.ops:
                self.inspect(operand.expr)
        elif isinstance(expr, n.BinExpr):
            self.inspect(expr.left)
            self.inspect(expr.right)
        elif isinstance(expr, n.UnaryExpr):
            self.inspect(expr.node)

    def _scan_macro(self, body, found) -> None:
        n = self.n
        for stmt in body:
            if found["test"] and found["loop"]:
                return
            if isinstance(stmt, n.If):
                if isinstance(stmt.test, n.Test):
                    found["test"] = True
                self._scan_macro(stmt.body, found)
                for branch in stmt.elif_:  # an elif is a nested IfCond in MiniJinja's false branch
                    self._scan_macro([branch], found)
                self._scan_macro(stmt.else_, found)
            elif isinstance(stmt, n.For):
                found["loop"] = True
                self._scan_macro(stmt.body, found)


def openai_content_format(template: str) -> bool:
    """Whether the gateway detects the "openai" content format (parts) rather than "string". A template that
    does not parse is "string" (chat_template.rs:326-345); Jinja2 stands in for MiniJinja's parser."""
    import jinja2

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    detector = _Detector()
    detector.walk([ast])
    return detector.openai


def _refuse_filter(name):
    def refuse(*args, **kwargs):
        raise ProductRefusal(f"unknown filter: filter {name} is unknown")
    return refuse


def _refuse_function(name):
    def refuse(*args, **kwargs):
        raise ProductRefusal(f"unknown function: {name} is unknown")
    return refuse


class SGLangRenderer(MiniJinjaRenderer):
    name = "sglang"
    homepage = HOMEPAGE
    template_name = TEMPLATE_NAME

    def environment_options(self) -> dict:
        options = super().environment_options()
        options.update(trim_blocks=False, lstrip_blocks=False)
        filters = {TOJSON_FILTER: self._tojson, "urlencode": no_urlencode}
        filters.update({name: _refuse_filter(name) for name in CONTRIB_FILTERS})
        options["filters"] = filters
        return options

    def functions(self) -> dict:
        return {name: _refuse_function(name) for name in CONTRIB_FUNCTIONS}

    def info(self) -> dict:
        return dict(super().info(), version=PRODUCT_VERSION, engine=f"minijinja {self.version}", source=SOURCE)

    @staticmethod
    def _tojson(serialised, *args, **kwargs):
        """chat_template.rs:365-433, given MiniJinja's own compact serialisation of the value."""
        from minijinja import safe

        if args:
            raise ProductRefusal("too many arguments")
        unknown = sorted(set(kwargs) - {"ensure_ascii", "indent", "separators", "sort_keys"})
        if unknown:
            raise ProductRefusal(f"too many arguments: unknown keyword argument '{unknown[0]}'")
        # no preserve_order: MiniJinja's maps serialise sorted, whatever sort_keys says
        value = _ryu_floats(_sorted_maps(json.loads(str(serialised))))
        indent = kwargs.get("indent")
        if indent is not None:
            if int(indent) < 0:
                raise ProductRefusal("invalid operation: indent cannot be negative")
            text = json.dumps(value, ensure_ascii=False, indent=int(indent))
        else:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return safe(_RYU_MARK.sub(lambda m: m.group(1), text))

    def prepare(self, request: RenderRequest):
        if not request.add_generation_prompt and not request.continue_final_message:
            return Skipped("the gateway's chat route always renders with add_generation_prompt=true")
        if request.documents is not None:
            return Skipped("the gateway's chat request has no documents")
        self._suffix = ""
        try:
            # serde reads the whole body (messages, then tools) before validation runs
            messages = [message_value(m, i) for i, m in enumerate(request.messages)]
            tools = None if request.tools is None else \
                [tool_value(t, f"tools[{i}]") for i, t in enumerate(request.tools)]
            refused = validation_refusal(messages)
            if refused is not None:
                raise RequestRefused(refused)
            openai = openai_content_format(request.template)
            for message in messages:
                if "content" in message:
                    message["content"] = transform_content(message["content"], openai)
            parse_tool_call_arguments(messages)
        except RequestRefused as exc:
            return Raised(str(exc), RefusalKind.RENDER)
        if request.continue_final_message and messages and messages[-1]["role"] == "assistant":
            last = messages.pop()
            if isinstance(last.get("content"), str):
                self._suffix = last["content"]
        context = {key: _sorted_maps(value) for key, value in request.kwargs.items()}
        # chat_template.rs:495-508: the four base variables win over any kwarg of the same name
        context.update(messages=_sorted_maps(messages), add_generation_prompt=True,
                       tools=_sorted_maps(tools), documents=None)
        return with_own_tojson(request.template, TOJSON_FILTER), context

    def finish(self, text: str, request: RenderRequest) -> str:
        return text + self._suffix

    def compile_refusal(self, source: str):
        return loop_control_refusal(source, TEMPLATE_NAME)


def ensure_environment():
    """The python of the cached environment holding the binding and Jinja2 (installed once)."""
    from .versions import ensure_venv

    return ensure_venv(f"sglang-{PRODUCT_VERSION}", REQUIREMENTS, f"sglang {PRODUCT_VERSION} reproduction",
                       pip_options=["--only-binary", ":all:"])


class SGLangRunner(BindingRunner):
    """SGLang's gateway 0.3.2 chat-template stage, reproduced on the minijinja 2.14.0 binding in a harness."""

    homepage = HOMEPAGE
    module = "runners.sglang_runner"
    runner_name = "sglang"
    imports = ("mistralrs_runner.py", "serde_shapes.py")
    binding_version = BINDING_VERSION
    product_version = PRODUCT_VERSION

    @classmethod
    def interpreter(cls, binding: str):
        return ensure_environment()

    def identity(self) -> dict:
        identity = super().identity()
        identity["packages"] = {"minijinja": self.binding, "jinja2": REQUIREMENTS[1].split("==")[1]}
        return identity


def main() -> None:
    serve_renderer(SGLangRenderer())


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:  # from this project's environment: install the harness's environment now
        print(ensure_environment())
    else:
        main()
