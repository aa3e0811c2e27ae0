"""Example harness: ferrox's chat-template evaluator (seed 000, chat_template.rs), reproduced on MiniJinja.

Configured exactly as that file describes its environment: MiniJinja defaults (no trim_blocks, no
lstrip_blocks), lenient undefined, `raise_exception`, a UTC `strftime_now` with its own strftime subset, its
own `tojson` (sorted keys, ", "/": " separators, serde_json string escapes, no HTML escaping, one argument
only; fed MiniJinja's own JSON of the value, so a float stays a float), and its five Python methods (dict.get, str.split/strip/lstrip/rstrip) -- any other method is
MiniJinja's UnknownMethod error. The context is built as its render() builds it: chat_template_kwargs first,
then messages, add_generation_prompt, tools (null when none or empty), bos/eos only when set; no documents.

The Python binding of MiniJinja has no unknown-method callback, so the method subset is enforced by renaming,
inside template tags only, calls of the pycompat methods ferrox does not have; the resulting UnknownMethod
error is reported with the original name.
"""
import datetime as dt
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Raised, RefusalKind, Rendered, Skipped  # noqa: E402
from runners.harness import serve  # noqa: E402
from runners.identity import harness_build  # noqa: E402
from runners.minijinja_runner import (  # noqa: E402
    error_text,
    load_template,
    minijinja_version,
    render_native,
    with_own_tojson,
)

# MiniJinja pycompat methods (measured on minijinja 3.1.0) that ferrox's python_method does not provide.
NOT_IN_FERROX = {
    "upper", "lower", "title", "capitalize", "replace", "startswith", "endswith", "find", "rfind", "count",
    "isdigit", "isupper", "islower", "isalpha", "isalnum", "isspace", "isnumeric", "splitlines", "format",
    "join", "items", "keys", "values",
}
RENAMED_SUFFIX = "__ferrox_unknown"
_METHOD_CALL = re.compile(r"(\.\s*)(" + "|".join(sorted(NOT_IN_FERROX)) + r")(\s*\()")
_TAG_OPEN = re.compile(r"\{\{|\{%|\{#")
_RAW_OPEN = re.compile(r"\{%-?\s*raw\s*-?%\}")
_RAW_CLOSE = re.compile(r"\{%-?\s*endraw\s*-?%\}")


def _rewrite_code(code: str) -> str:
    """Rename blocked method calls in tag code, leaving string literals alone."""
    out, i = [], 0
    while i < len(code):
        quote_at = min((p for p in (code.find("'", i), code.find('"', i)) if p != -1), default=-1)
        end = quote_at if quote_at != -1 else len(code)
        out.append(_METHOD_CALL.sub(lambda m: m.group(1) + m.group(2) + RENAMED_SUFFIX + m.group(3), code[i:end]))
        if quote_at == -1:
            break
        quote, j = code[quote_at], quote_at + 1
        while j < len(code) and code[j] != quote:
            j += 2 if code[j] == "\\" else 1
        out.append(code[quote_at:j + 1])
        i = j + 1
    return "".join(out)


def restrict_methods(source: str) -> str:
    out, i = [], 0
    while True:
        m = _TAG_OPEN.search(source, i)
        if m is None:
            out.append(source[i:])
            return "".join(out)
        out.append(source[i:m.start()])
        raw = _RAW_OPEN.match(source, m.start())
        if raw:
            close = _RAW_CLOSE.search(source, raw.end())
            stop = close.end() if close else len(source)
            out.append(source[m.start():stop])
            i = stop
            continue
        closer = {"{{": "}}", "{%": "%}", "{#": "#}"}[m.group()]
        stop = source.find(closer, m.end())
        stop = len(source) if stop == -1 else stop + 2
        tag = source[m.start():stop]
        out.append(tag if closer == "#}" else _rewrite_code(tag))
        i = stop


# ---- tojson: write_python_json over serde_json values ----
def _serde_string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\f\n\r\t":
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _serde_float(value: float) -> str:
    if not math.isfinite(value):
        return "null"  # serde_json writes non-finite floats as null
    text = repr(value)  # shortest round-trip digits, as ryu; ryu spells exponents 1e-5 / 1e100
    if "e" in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{int(exponent)}"
    return text


def _python_json(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_serde_string(str(k))}: {_python_json(value[k])}"
                               for k in sorted(value, key=str)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python_json(v) for v in value) + "]"
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _serde_float(value)
    if isinstance(value, str):
        return _serde_string(value)
    raise ValueError(f"tojson: value is not serialisable: {type(value).__name__}")


TOJSON_FILTER = "chatgold_ferrox_tojson"


def tojson(serialised, *args, **kwargs):
    """ferrox's tojson, given MiniJinja's own compact serialisation of the value (with_own_tojson): a Python
    filter handed the value itself would see 100.0 as 100."""
    # One parameter, as the Rust filter: tojson(indent=...) or tojson(ensure_ascii=...) fail in the engine.
    if args or kwargs:
        raise TemplateRaised("too many arguments (in chat): ferrox's tojson takes no arguments")
    try:
        return _python_json(json.loads(str(serialised)))
    except ValueError as exc:
        raise TemplateRaised(f"invalid operation: {exc}") from None


# ---- strftime_now: the UTC subset ----
def format_utc(moment: dt.datetime, fmt: str) -> str:
    out, i = [], 0
    while i < len(fmt):
        ch = fmt[i]
        i += 1
        if ch != "%":
            out.append(ch)
            continue
        if i >= len(fmt):
            raise _Unsupported("%")
        spec, pad = fmt[i], True
        i += 1
        if spec == "-":
            if i >= len(fmt):
                raise _Unsupported("-")
            pad, spec = False, fmt[i]
            i += 1

        def num(v, width):
            return f"{v:0{width}d}" if pad else str(v)

        values = {
            "Y": lambda: str(moment.year), "y": lambda: num(moment.year % 100, 2), "m": lambda: num(moment.month, 2),
            "d": lambda: num(moment.day, 2), "e": lambda: f"{moment.day:2d}", "H": lambda: num(moment.hour, 2),
            "M": lambda: num(moment.minute, 2), "S": lambda: num(moment.second, 2),
            "j": lambda: num(moment.timetuple().tm_yday, 3), "B": lambda: MONTHS[moment.month - 1],
            "b": lambda: MONTHS[moment.month - 1][:3], "A": lambda: WEEKDAYS[moment.weekday()],
            "a": lambda: WEEKDAYS[moment.weekday()][:3],
            "F": lambda: f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}",
            "T": lambda: f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}", "%": lambda: "%",
        }
        if spec not in values:
            raise _Unsupported(spec)
        out.append(values[spec]())
    return "".join(out)


MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class _Unsupported(Exception):
    pass


class TemplateRaised(Exception):
    """A failure ferrox's own functions and filters report (raise_exception, strftime_now, tojson)."""

    kind = RefusalKind.RENDER


class TemplateRaiseException(TemplateRaised):
    """The template's own raise_exception(...)."""

    kind = RefusalKind.RAISE


class Ferrox:
    def __init__(self):
        from minijinja import Environment

        self.now = None
        self._rewritten = (None, None)
        self.env = Environment(undefined_behavior="lenient", pycompat=True, debug=False,
                               globals={"raise_exception": self.raise_exception, "strftime_now": self.strftime_now},
                               filters={TOJSON_FILTER: tojson})

    @staticmethod
    def raise_exception(msg):
        raise TemplateRaiseException(f"invalid operation: template raised: {msg}")

    def strftime_now(self, fmt):
        try:
            return format_utc(self.now, str(fmt))
        except _Unsupported as exc:
            raise TemplateRaised(
                f"invalid operation: strftime_now: unsupported format specifier `%{exc}` in {json.dumps(str(fmt))} -- "
                "ferrox implements a subset (%Y %y %m %d %e %H %M %S %j %B %b %A %a %F %T %%) "
                "and refuses rather than stamping a wrong date into the prompt") from None

    def render(self, request):
        from minijinja import TemplateError

        if request.documents is not None:
            return Skipped("ferrox's RenderOptions has no documents")
        if request.continue_final_message:
            return Skipped("ferrox has no continue_final_message")
        if not request.template.strip():
            return Rendered(builtin_chatml(request))
        context = dict(request.kwargs)
        context["messages"] = request.messages
        context["add_generation_prompt"] = request.add_generation_prompt
        context["tools"] = request.tools if request.tools else None
        for name, token in (("bos_token", request.bos_token), ("eos_token", request.eos_token)):
            if token is not None:
                context[name] = token
        moment = dt.datetime.fromisoformat(request.now.replace("Z", "+00:00"))
        self.now = moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment
        if request.template != self._rewritten[0]:
            # The rewrite is a Python-level scan: once per template, not per cell (the runner sends a
            # template's cells to one process in a row).
            self._rewritten = (request.template, with_own_tojson(restrict_methods(request.template), TOJSON_FILTER))
        source = self._rewritten[1]
        try:
            load_template(self.env, "chat", source)
        except TemplateError as exc:
            return Raised(f"chat template does not compile: {exc.message}", RefusalKind.COMPILE)
        try:
            return Rendered(render_native(self.env, source, context, name="chat"))
        except TemplateRaised as exc:
            return Raised(f"chat template failed to render: {exc}", exc.kind)
        except TemplateError as exc:
            cause = exc
            while cause is not None and not isinstance(cause, TemplateRaised):
                cause = cause.__cause__ or cause.__context__
            text = str(cause) if cause is not None else error_text(exc).replace(RENAMED_SUFFIX, "")
            kind = cause.kind if cause is not None else RefusalKind.RENDER
            return Raised(f"chat template failed to render: {text}", kind)


def builtin_chatml(request):
    """ferrox's BuiltinTemplate::ChatMl, for a checkpoint whose template is empty."""
    out = []
    for m in request.messages:
        text = m.get("content") if isinstance(m.get("content"), str) else "".join(
            p.get("text", "") for p in (m.get("content") or []) if isinstance(p, dict) and isinstance(p.get("text"), str))
        for call in m.get("tool_calls") or []:
            f = call.get("function") or {}
            args = f.get("arguments", "{}")
            args = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
            text += f'<tool_call>{{"name": "{f.get("name", "")}", "arguments": {args}}}</tool_call>'
        out.append(f"<|im_start|>{m.get('role') or 'user'}\n{text}<|im_end|>\n")
    if request.add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


if __name__ == "__main__":
    engine = Ferrox()
    serve({"name": "ferrox", "version": f"ferrox chat_template.rs on minijinja {minijinja_version()}",
           "language": "rust", "homepage": "seed 000: ferrox chat_template.rs"}, engine.render,
          build=harness_build(__file__, ["minijinja_runner.py"], ["minijinja"]))
