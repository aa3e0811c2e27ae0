"""mistral.rs as its PyPI package renders a chat request: `mistralrs` 0.9.5 (PyPI 2026-10-19), reproduced.

The route: the Python API (`Runner.send_chat_completion_request` with mistralrs-pyo3's `ChatCompletionRequest`),
whose request types keep only a message's role and content. The HTTP server's route is `mistralrs-server`
(runners/mistralrs_server.py). Citations at a tag are to v0.9.2, the newest release tag in the source history
read; every text cited was checked against the 0.9.5 wheel (tests/test_mistralrs.py).

What is reproduced, and from where (mistral.rs, github.com/EricLBuehler/mistral.rs):
- the engine: MiniJinja 2.14.0 with minijinja-contrib 2.14.0 (crate versions embedded in the 0.9.5 wheel's
  extension module), rendered here by the `minijinja` binding 2.14.0 from PyPI, the same engine release.
- `mistralrs-core/src/pipeline/chat_template.rs` (`apply_chat_template_to`, read at commit
  0b4e96991a2df19de724d3ca39a33dedd20f10a6 and a later stored version whose strings match the 0.9.5 wheel):
  `Environment::new()` with trim_blocks and lstrip_blocks, lenient undefined, pycompat's unknown-method
  callback; `raise_exception(msg)` failing as "invalid operation: msg"; `strftime_now(fmt)` (chrono, local
  time; here the case's frozen clock in UTC); its own `tojson`, which in 0.9.5 writes Python `json.dumps`
  separators (", ", ": "), no HTML escaping, an `indent` over 256 an error ("exceeds the maximum of 256"); the source rewrites applied before
  compiling, in order: `namespace(name=tcid if tcid else '')` parenthesised, `[::-1]` -> `|reverse`,
  `range(x, -1, -1)` -> `range(x)|reverse`, GLM-4's `{{ meta }}` lines dropped, `{% generation %}` /
  `{% endgeneration %}` tags (any whitespace control) removed.
- the variables bound: messages, add_generation_prompt, bos_token, eos_token, unk_token (each `none` when the
  model has none), date_string (`%d, %B, %Y` of now), enable_thinking (true unless the request says false),
  reasoning_effort only when requested; `tools` only when the request has tools (then also `xml_tools` and
  `builtin_tools`); no `tools` variable at all for an empty list.
- the Python API's message shape (`mistralrs-pyo3` `lib.rs` @3961bcfc and `requests.rs` @0a082626, whose texts
  match the 0.9.5 wheel): only `role` and `content` reach the template, and a message missing either is a
  Rust panic ("no entry found for key"); a content list of one part becomes that part's `text`, whatever its
  type; of several parts, a user message's only (other roles refused), each part checked (a text part needs a
  string `text`, an image part its `image_url`), text parts joined with a space into one text part; a message
  value that is not a string or a list of string maps (`content: null`, tool calls with object arguments) is
  refused by the type conversion. Image, audio and video parts take a media path this runner does not
  reproduce: such cells are Skipped, saying so.
- tools (`mistralrs-mcp/src/tools.rs` @051db54b): each is read by serde from `json.dumps(tool)`, so a tool its
  `Tool` struct cannot hold (no `type`, a type other than "function", no `function.name`, `parameters` not a
  map) is refused with serde's message (runners/serde_shapes.py); a held tool is re-shaped to {type,
  function: {name, description?, parameters (type, properties, required, additionalProperties first),
  strict?}}, `arguments` read as `parameters`.
- the product's features: the workspace asks MiniJinja for `builtins` and `json` only, so `{% break %}` /
  `{% continue %}` are "unknown statement" syntax errors and `urlencode` is an unknown filter (the PyPI binding
  has both: the runner refuses them as the product does); `preserve_order` is on in 0.9.5 (observed).

What the product's request cannot carry is Skipped, never faked: `add_generation_prompt: false` (the chat API
always adds it), documents, continue_final_message, and template kwargs other than enable_thinking and
reasoning_effort.

Checked against the real wheel: scripts/verify_mistralrs.py renders cells both ways (the wheel can only say
whether its prompt equals a given text: see that script) and tests/test_mistralrs.py runs it on a sample.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from . import serde_shapes as shapes
from .base import Raised, RefusalKind, RenderRequest, Skipped
from .minijinja_runner import (
    BindingRunner,
    EngineRefusal,
    MiniJinjaRenderer,
    serve_renderer,
    with_own_tojson,
)

PRODUCT_VERSION = "0.9.5"
BINDING_VERSION = "2.14.0"
HOMEPAGE = "https://github.com/EricLBuehler/mistral.rs"
SOURCE = ("mistralrs-core/src/pipeline/chat_template.rs @0b4e96991a2df19de724d3ca39a33dedd20f10a6 and the "
          "mistralrs 0.9.5 wheel")

_LOOP_CONTROL = re.compile(r"\{%[-+]?\s*(break|continue)\s*[-+]?%\}")
_RANGE_DOWN = re.compile(r"range\((?P<expr>[^,]+),\s*-1,\s*-1\)")
_GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")
_GLM_META_SET = '{%- set meta = message.get("metadata", "") %}'
BUILTIN_TOOLS = ("browser", "python", "code_interpreter", "web_search", "brave_search", "wolfram_alpha")
REQUEST_KWARGS = ("enable_thinking", "reasoning_effort")
INDENT_CAP = 256
# chat_template.rs @v0.9.2 lines 358-367 (`tojson`): an `indent` over the cap is an error, not capped.
INDENT_ERROR = "invalid operation: tojson `indent` of {indent} exceeds the maximum of 256"

# mistralrs-core/src/request.rs @v0.9.2: `ReasoningEffort` parsed from the trimmed, ASCII-lowercased text
# (lines 118-133; "none" is "off", "max" is "xhigh"), bound by its canonical wire value (`as_str`, lines 62-70).
REASONING_EFFORTS = {"off": "off", "none": "off", "low": "low", "medium": "medium", "high": "high",
                     "xhigh": "xhigh", "max": "xhigh"}
EFFORT_ERROR = "invalid reasoning effort `{value}`; expected one of: off, none, low, medium, high, xhigh, max"


def _ascii_lower(text: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in text)


def reasoning_controls(enable_thinking, effort):
    """(enable_thinking, reasoning_effort or None) as mistral.rs resolves a request's two reasoning controls
    (request.rs @v0.9.2 `resolve_reasoning_controls`, lines 165-185; the Python API checks them when the
    request is built, mistralrs-pyo3/src/requests.rs @v0.9.2 lines 497-500): an effort sets enable_thinking
    (false only for "off"); a contradicting explicit enable_thinking is an error."""
    if effort is not None:
        canonical = REASONING_EFFORTS.get(_ascii_lower(effort.strip()))
        if canonical is None:
            raise ProductRefusal(EFFORT_ERROR.format(value=effort))
        if enable_thinking is True and canonical == "off":
            raise ProductRefusal("reasoning effort `off` conflicts with enable_thinking=true")
        if enable_thinking is False and canonical != "off":
            raise ProductRefusal(f"reasoning effort `{canonical}` conflicts with enable_thinking=false")
        return canonical != "off", canonical
    return (True if enable_thinking is None else enable_thinking), None


class ProductRefusal(EngineRefusal):
    """The product refuses here with this exact message (a feature its MiniJinja build lacks)."""


def loop_control_refusal(source: str, name: str = "chat_template") -> Optional[Raised]:
    """MiniJinja without the loop_controls feature: `{% break %}`/`{% continue %}` do not parse."""
    found = _LOOP_CONTROL.search(source)
    if found is None:
        return None
    line = source.count("\n", 0, found.start()) + 1
    return Raised(f"syntax error: unknown statement {found.group(1)} (in {name}:{line})", RefusalKind.COMPILE)


def no_urlencode(*args, **kwargs):
    raise ProductRefusal("unknown filter: filter urlencode is unknown")


# mistral.rs registers its own `tojson`: this filter, fed MiniJinja's JSON of the value (with_own_tojson).
TOJSON_FILTER = "chatgold_mistralrs_tojson"


def rewrite_source(source: str) -> str:
    """The template source as mistral.rs 0.9.5 compiles it."""
    source = source.replace("namespace(name=tcid if tcid else '')", "namespace(name=(tcid if tcid else ''))")
    source = source.replace("[::-1]", "|reverse")
    source = _RANGE_DOWN.sub(r"range(\g<expr>)|reverse", source)
    if "{{ meta }}" in source:
        source = source.replace(_GLM_META_SET, "").replace("{{ meta }}", "")
    return _GENERATION_TAG.sub("", source)


# The Python API's conversion of one message value (mistralrs-pyo3: a string, or a list of maps whose values are
# strings or string maps); anything else fails with this TypeError, observed with the 0.9.5 wheel.
CONVERSION_ERROR = ("failed to convert the value to 'Union[alloc::string::String, alloc::vec::Vec<std::collections::"
                    "hash::map::HashMap<alloc::string::String, either::Either<alloc::string::String, std::collections::"
                    "hash::map::HashMap<alloc::string::String, alloc::string::String>>>>]'")


def _converts(value) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list):
        return False
    for item in value:
        if not isinstance(item, dict):
            return False
        for inner in item.values():
            if not (isinstance(inner, str) or (isinstance(inner, dict)
                                                and all(isinstance(v, str) for v in inner.values()))):
                return False
    return True


PART_FORMAT_ERROR = ("Expected array content sub-content to be of format {{`type`: `text`, `text`: ...}} and "
                     "{{`type`: `url`, `image_url`: {{`url`: ...}}}}")
# The 0.9.5 wheel's message for a list content of several parts outside a user message (its placeholder unfilled).
ROLE_ERROR = "Role for an image message must be `user`, but it is {role}"


class NotReproduced(Exception):
    """A request path of the product this runner does not reproduce (the cell is Skipped, saying so)."""


# mistralrs-pyo3's lib.rs reads `message["role"]` and `message["content"]` from a HashMap and unwraps the
# role as a string: a missing key or a list role is a Rust panic (texts observed with the 0.9.5 wheel).
MISSING_KEY_PANIC = "no entry found for key"
ROLE_PANIC = "called `Option::unwrap()` on a `None` value"
MEDIA_PARTS = ("image_url", "audio_url", "video_url")


def _part_refusal(part: dict) -> Optional[str]:
    """The wheel's refusal of one part of a several-part content, or None (observed with the 0.9.5 wheel)."""
    kind = part.get("type")
    if kind == "text":
        if "text" not in part:
            return "Text sub-content must have `text` key."
        if not isinstance(part["text"], str):
            return "Text sub-content `text` key must be a string."
        return None
    if kind == "image_url":
        return None if "image_url" in part else "Image sub-content must have `image_url` key."
    if kind == "audio_url":
        url = part.get("audio_url")
        return None if isinstance(url, dict) and "url" in url else \
            "Audio sub-content `audio_url` object must have a `url` key."
    if kind == "video_url":
        return None
    return PART_FORMAT_ERROR


def _debug_map(value: dict) -> str:
    """A HashMap<String, String> as Rust's `{:?}` prints it."""
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                           for k, v in value.items()) + "}"


def python_api_message(message: dict) -> dict:
    """A message as the mistralrs Python API hands it to the template (mistralrs-pyo3 lib.rs, observed with the
    0.9.5 wheel): only role and content. A content list of one part becomes that part's `text` whatever its
    type; of any other length it is a user message's only (refused for other roles), each part checked, text
    parts joined with a space into one text part."""
    if not all(_converts(value) for value in message.values()):
        raise ProductRefusal(CONVERSION_ERROR)
    if "role" not in message or "content" not in message:
        raise ProductRefusal(MISSING_KEY_PANIC)
    if not isinstance(message["role"], str):
        raise ProductRefusal(ROLE_PANIC)
    content = message["content"]
    if isinstance(content, list):
        if len(content) == 1:
            if "text" not in content[0]:
                raise ProductRefusal("Expected `text` key in input message.")
            text = content[0]["text"]
            if isinstance(text, dict) and len(text) > 1:
                raise NotReproduced("mistralrs prints a map `text` with Rust's HashMap order, which varies")
            content = _debug_map(text) if isinstance(text, dict) else text
        elif message["role"] != "user":
            raise ProductRefusal(ROLE_ERROR)
        else:
            for part in content:
                refused = _part_refusal(part)
                if refused is not None:
                    raise ProductRefusal(refused)
            if any(part.get("type") in MEDIA_PARTS for part in content):
                raise NotReproduced("mistralrs's media-message preprocessing (image, audio, video parts) is not "
                                    "reproduced")
            content = [{"type": "text", "text": " ".join(part["text"] for part in content)}]
    return {"role": message["role"], "content": content}


# mistralrs-mcp/src/tools.rs @051db54b: `Tool {#[serde(rename = "type")] tp: ToolType, function: Function}`,
# ToolType's one variant "function", `Function {description: Option<String>, name: String, #[serde(alias =
# "arguments")] parameters: Option<HashMap<String, Value>>, strict: Option<bool>}`; each tool is read from
# `json.dumps(tool)` (the Python API takes `tool_schemas` as JSON strings), so serde's columns count in that.
_FUNCTION = shapes.Struct("Function", [
    shapes.Field("description", shapes.Str(nullable=True), required=False), shapes.Field("name", shapes.Str()),
    shapes.Field("parameters", shapes.MapOf(nullable=True), required=False, aliases=("arguments",)),
    shapes.Field("strict", shapes.Bool(nullable=True), required=False)])
TOOL = shapes.Struct("Tool", [shapes.Field("type", shapes.UnitEnum(("function",))),
                              shapes.Field("function", _FUNCTION)])


def tool_refusal(tool) -> Optional[str]:
    error = shapes.first_error(TOOL, tool, separators=(", ", ": "), ensure_ascii=True)
    return None if error is None else error.text(with_path=False)


def _ordered_parameters(parameters):
    """JSON-schema keys as the newest chat_template.rs orders them: type, properties, required,
    additionalProperties, then the rest alphabetically."""
    if not isinstance(parameters, dict):
        return parameters
    first = [k for k in ("type", "properties", "required", "additionalProperties") if k in parameters]
    return {k: parameters[k] for k in first + sorted(k for k in parameters if k not in first)}


def reshaped_tool(tool: dict) -> dict:
    """A tool (one TOOL holds) as the template sees it: {type, function: {name, description?, parameters,
    strict?}}, `parameters` read under its alias `arguments` too."""
    function = tool["function"]
    out = {"name": function["name"]}
    if function.get("description") is not None:
        out["description"] = function["description"]
    out["parameters"] = _ordered_parameters(function.get("parameters", function.get("arguments")))
    if function.get("strict") is not None:
        out["strict"] = function["strict"]
    return {"type": tool["type"], "function": out}


_RYU_MARK = re.compile(r'"\\u0000ryu:([^"]*)"')


class _Ryu(str):
    pass


def ryu(value: float) -> str:
    """A float as mistral.rs 0.9.5's tojson writes it: serde_json's (the ryu crate's) choice of decimal (at least
    one fractional digit while the decimal exponent is in (-5, 16]) or scientific notation, the latter with a
    signed exponent (1.5e+300, observed with the wheel)."""
    if value != value or value in (float("inf"), float("-inf")):
        return "null"
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    digits = mantissa.replace("-", "").replace(".", "")
    digits = digits.rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    point = int(exponent) + 1  # digits before the decimal point
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if 0 < point <= 16:
        whole = digits.ljust(point, "0")
        return f"{sign}{whole[:point]}.{whole[point:] or '0'}"
    rest = f".{digits[1:]}" if len(digits) > 1 else ""
    return f"{sign}{digits[0]}{rest}e{point - 1:+d}"


def _ryu_floats(value):
    """Floats replaced by marked strings carrying serde_json's spelling, unmarked after json.dumps."""
    if isinstance(value, float):
        return "\u0000ryu:" + ryu(value)
    if isinstance(value, dict):
        return {k: _ryu_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_ryu_floats(v) for v in value]
    return value


class MistralRsRenderer(MiniJinjaRenderer):
    name = "mistralrs"
    homepage = HOMEPAGE
    raise_format = "invalid operation: {message}"

    def environment_options(self) -> dict:
        options = super().environment_options()
        options["filters"] = {TOJSON_FILTER: self._tojson, "urlencode": no_urlencode}
        return options

    def info(self) -> dict:
        return dict(super().info(), version=PRODUCT_VERSION, engine=f"minijinja {self.version}", source=SOURCE)

    @staticmethod
    def _tojson(serialised, indent=None, **kwargs):
        """mistral.rs's tojson, given MiniJinja's own compact serialisation of the value (see with_own_tojson)."""
        from minijinja import safe

        value = _ryu_floats(json.loads(str(serialised)))
        if indent is not None:
            if int(indent) > INDENT_CAP:
                raise ProductRefusal(INDENT_ERROR.format(indent=int(indent)))
            text = json.dumps(value, ensure_ascii=False, indent=int(indent))
        else:
            text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        return safe(_RYU_MARK.sub(lambda m: m.group(1), text))

    def prepare(self, request: RenderRequest):
        if not request.add_generation_prompt:
            return Skipped("mistralrs's chat API always renders with add_generation_prompt=true")
        if request.documents is not None:
            return Skipped("mistralrs's chat API has no documents")
        if request.continue_final_message:
            return Skipped("mistralrs's chat API has no continue_final_message")
        extra = sorted(set(request.kwargs) - set(REQUEST_KWARGS))
        if extra:
            return Skipped(f"mistralrs's chat API cannot pass template variables {', '.join(extra)}")
        try:
            messages = [python_api_message(m) for m in request.messages]
        except ProductRefusal as exc:
            return Raised(str(exc), RefusalKind.RENDER)
        except NotReproduced as exc:
            return Skipped(str(exc))
        return self.prepare_chat(request, messages, request.kwargs)

    def prepare_chat(self, request: RenderRequest, messages: list, kwargs: dict):
        """The chat-template stage every route of mistral.rs shares, given the messages as the route hands
        them over and the reasoning controls it read."""
        for tool in request.tools or ():
            refused = tool_refusal(tool)
            if refused is not None:
                return Raised(refused, RefusalKind.RENDER)
        thinking, effort = kwargs.get("enable_thinking"), kwargs.get("reasoning_effort")
        if not (thinking is None or isinstance(thinking, bool)) or not (effort is None or isinstance(effort, str)):
            return Skipped("the Python API's conversion of a non-bool enable_thinking or a non-string "
                           "reasoning_effort is not reproduced")
        try:
            thinking, effort = reasoning_controls(thinking, effort)
        except ProductRefusal as exc:
            return Raised(str(exc), RefusalKind.RENDER)
        now = self._parse_now(request.now)
        context = {"messages": messages, "add_generation_prompt": True, "bos_token": request.bos_token,
                   "eos_token": request.eos_token, "unk_token": None, "date_string": now.strftime("%d, %B, %Y"),
                   "enable_thinking": thinking}
        if effort is not None:
            # chat_template.rs @v0.9.2 lines 852-854 and 867-869: reasoning_strength is the same value, since
            # 0.9.1 (undefined, like reasoning_effort, when the request has no effort).
            context.update(reasoning_effort=effort, reasoning_strength=effort)
        if request.tools:
            tools = [reshaped_tool(t) for t in request.tools]
            names = [t["function"]["name"] for t in tools]
            context.update(tools=tools, xml_tools=tools, builtin_tools=[n for n in names if n in BUILTIN_TOOLS])
        return with_own_tojson(rewrite_source(request.template), TOJSON_FILTER), context

    def compile_refusal(self, source: str):
        return loop_control_refusal(source)


class MistralRsRunner(BindingRunner):
    """mistral.rs 0.9.5's chat-template stage, reproduced on the minijinja 2.14.0 binding in a harness process."""

    homepage = HOMEPAGE
    module = "runners.mistralrs_runner"
    runner_name = "mistralrs"
    imports = ("serde_shapes.py",)
    binding_version = BINDING_VERSION
    product_version = PRODUCT_VERSION


def main() -> None:
    serve_renderer(MistralRsRenderer())


if __name__ == "__main__":
    main()
