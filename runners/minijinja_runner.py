"""MiniJinja's Python binding, `minijinja` on PyPI, with the options this runner sets; at any PyPI version.

This is the engine, not a product: no embedder uses exactly this configuration (the embedder-faithful
runners are `tgi` and `mistralrs`, runners/tgi_runner.py and runners/mistralrs_runner.py). The binding is
compiled with its own feature set (loop controls, preserve_order, urlencode and more are on), and the runner
sets: trim_blocks and lstrip_blocks on, lenient undefined, `pycompat=True` where the binding has it (2.9.0
and later: minijinja-contrib's unknown-method callback, `.items()`, `.strip()`, ...), no debug output, and two
functions: `raise_exception(message)` (the template's refusal) and `strftime_now(format)` (Python's strftime
of the case's frozen clock). `tojson` and every other filter are the binding's own. Where MiniJinja differs
from jinja2 (no `tojson(ensure_ascii=...)`, no `{% generation %}`, its own error texts, `true` printed as
`true` before 2.22.0) the difference is the point.

Variables are bound as HF's apply_chat_template binds them: messages, tools, documents,
add_generation_prompt, bos_token/eos_token only when the model has them, then the extra kwargs.
`continue_final_message` is HF's post-processing of the rendered text, not a template feature: such cells are
Skipped.

`minijinja` is the pinned binding of this environment (pyproject.toml); `minijinja@VERSION` installs that
binding version from PyPI into <cache>/venvs/minijinja-VERSION and runs this module with that interpreter.
Runs in a harness process (python -m runners.minijinja_runner) so a hostile template is bounded.
"""
from __future__ import annotations

import itertools
import json
import marshal
import re
from collections import OrderedDict
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import Any, Optional

from .base import Outcome, Raised, RefusalKind, Rendered, RenderRequest, Skipped
from .command import CommandRunner
from .harness import python_harness

HOMEPAGE = "https://github.com/mitsuhiko/minijinja"


def minijinja_version() -> str:
    try:
        return _dist_version("minijinja")
    except PackageNotFoundError:
        return "missing"


class TemplateRaised(Exception):
    """raise_exception(...) called by the template."""


class EngineRefusal(Exception):
    """A function or filter fails exactly as the emulated product's engine does (its message, kind render)."""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = {"true", "false", "none", "True", "False", "None", "loop", "self"}


def minijinja_literal(value: Any) -> str:
    """`value` (JSON data) as a MiniJinja expression literal: the engine builds its own native values from it."""
    if value is None:
        return "none"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)  # MiniJinja's string escapes are JSON's (\uXXXX, surrogate pairs included)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(minijinja_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {minijinja_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not JSON data: {type(value).__name__}")


# (id of the environment, name) -> (the environment, kept alive so its id stays its own; the source last
# compiled under that name)
_LOADED: dict = {}


def load_template(env, name: str, source: str) -> None:
    """env.add_template, skipped when that exact source is already loaded under the name: a batch renders a
    template's cells one after another, so it compiles once instead of once per cell."""
    key = (id(env), name)
    if _LOADED.get(key, (None, None))[1] == source:
        return
    _LOADED.pop(key, None)  # a compile error below must not leave the old source recorded
    env.add_template(name, source)
    _LOADED[key] = (env, source)


# Compiled root templates, least recently used first: (id of the environment, name, the context marshalled)
# -> (the environment, kept alive so its id stays its own; the root's name). A harness renders every template
# over the same few conversations, so each root is compiled once rather than once per cell.
_ROOTS: "OrderedDict[tuple, tuple]" = OrderedDict()
ROOT_CACHE = 1024


def _root_source(context: dict, name: str) -> str:
    sets = "".join(f"{{% set {key} = {minijinja_literal(value)} %}}" for key, value in context.items())
    return sets + "{% include " + json.dumps(name) + " %}"


def _root_for(env, context: dict, name: str) -> str:
    try:
        # marshal: the fastest exact serialisation of JSON data (True, 1 and 1.0 stay apart); process-local.
        key = (id(env), name, marshal.dumps(context))
    except ValueError:
        key = None  # not plain data: minijinja_literal says why below
    if key is not None and key in _ROOTS:
        _ROOTS.move_to_end(key)
        return _ROOTS[key][1]
    source = _root_source(context, name)
    root = f"chatgold_root_{next(_ROOT_NUMBERS)}"
    env.add_template(root, source)
    if key is not None:
        _ROOTS[key] = (env, root)
        while len(_ROOTS) > ROOT_CACHE:
            old_env, old_root = _ROOTS.popitem(last=False)[1]
            old_env.remove_template(old_root)
    return root


_ROOT_NUMBERS = itertools.count(1)


def _native_string(value) -> bool:
    """A str the binding hands over as a native MiniJinja string, exactly (lone surrogates cannot cross)."""
    if type(value) is not str:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def render_native(env, source: str, context: dict, name: str = "chat_template") -> str:
    """Render `source` with `context` bound as *native* MiniJinja values, as a Rust embedder's serde data is.

    The Python binding would otherwise hand the template live Python dicts and lists (Python repr, Python
    methods such as .pop(), mutation), which no Rust embedder exposes. So structured data travels as literals
    in a root template that sets each variable and includes the chat template unchanged; plain strings (the
    special tokens) go in as render arguments, which the binding turns into native strings. A root is compiled
    once per distinct structured context and kept (ROOT_CACHE of them): MiniJinja evaluates its literals afresh
    on every render, so the template always starts from the same native values.
    """
    load_template(env, name, source)  # a syntax error raises here
    strings, structured = {}, {}
    for key, value in context.items():
        if not _IDENTIFIER.match(key) or key in _RESERVED:
            continue  # cannot be named by a template anyway
        if _native_string(value):
            strings[key] = value
        else:
            structured[key] = value
    return env.render_template(_root_for(env, structured, name), **strings)


# A product's own `tojson` cannot be a Python filter handed the value: the binding hands Python an integral float
# as an int (0.0 arrives as 0). So each `|tojson(...)` is routed through MiniJinja's own compact tojson (exact
# values) into the product's filter, which gets the arguments and re-serialises the JSON text.
_TOJSON_USE = re.compile(r"\|\s*tojson\b(\s*\([^()]*\))?")


def with_own_tojson(source: str, name: str) -> str:
    """Every `|tojson(...)` in `source` routed through MiniJinja's tojson into the filter `name`."""
    return _TOJSON_USE.sub(lambda m: f"|tojson|{name}{m.group(1) or ''}", source)


def error_text(exc) -> str:
    """The engine's own message for the failure inside the chat template (the include wrapper peeled off)."""
    causes = [line[len("caused by: "):] for line in str(exc).splitlines() if line.startswith("caused by: ")]
    return causes[-1] if causes else exc.message


def _cause_of_type(exc, kind):
    cause = exc
    while cause is not None:
        if isinstance(cause, kind):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def raised_by_template(exc) -> Optional[str]:
    cause = _cause_of_type(exc, TemplateRaised)
    return None if cause is None else str(cause)


class MiniJinjaRenderer:
    """Renders in this process. Use MiniJinjaRunner for the bounded, isolated form.

    Subclasses (the embedder-faithful runners) change the environment (`environment_options`, `functions`),
    what reaches the template (`prepare`: the source as the product compiles it and the variables it binds,
    or an outcome when the product cannot express the request) and the text after rendering (`finish`)."""

    name = "minijinja"
    homepage = HOMEPAGE
    # How the product words a raise_exception(message) refusal.
    raise_format = "{message}"
    # The name the product registers the chat template under (its errors say "(in NAME:LINE)").
    template_name = "chat_template"

    def __init__(self):
        from minijinja import Environment

        from .hf import parse_now

        self._parse_now = parse_now
        self._now = None
        self.version = minijinja_version()
        options = self.environment_options()
        try:
            self.env = Environment(**options)
            self.pycompat = bool(options.get("pycompat"))
        except TypeError:  # bindings before 2.9.0 have no pycompat switch (and no unknown-method callback)
            options.pop("pycompat", None)
            self.env = Environment(**options)
            self.pycompat = False

    def environment_options(self) -> dict:
        return {"trim_blocks": True, "lstrip_blocks": True, "undefined_behavior": "lenient", "pycompat": True,
                "debug": False,  # debug output dumps the whole context into every error
                "globals": self.functions()}

    def functions(self) -> dict:
        return {"raise_exception": self._raise_exception, "strftime_now": self._strftime_now}

    def info(self) -> dict:
        return {"name": self.name, "version": self.version, "language": "rust", "homepage": self.homepage,
                "pycompat": self.pycompat}

    @staticmethod
    def _raise_exception(message=""):
        raise TemplateRaised(str(message))

    def _strftime_now(self, fmt):
        # The case's frozen clock as naive UTC wall-clock time, as HF's strftime_now sees it on a UTC machine.
        return self._now.strftime(str(fmt))

    def prepare(self, request: RenderRequest):
        """(template source, variables) as the engine gets them, or an Outcome when the cell is not rendered."""
        if request.continue_final_message:
            return Skipped("continue_final_message is apply_chat_template post-processing; the binding has none")
        context = {}
        if request.bos_token is not None:
            context["bos_token"] = request.bos_token
        if request.eos_token is not None:
            context["eos_token"] = request.eos_token
        context.update(request.kwargs)
        context.update(messages=request.messages, tools=request.tools, documents=request.documents,
                       add_generation_prompt=request.add_generation_prompt)
        return request.template, context

    def finish(self, text: str, request: RenderRequest) -> str:
        return text

    def compile_refusal(self, source: str):
        """A refusal the product gives before compiling (a syntax feature it lacks), or None."""
        return None

    def render(self, request: RenderRequest) -> Outcome:
        from minijinja import TemplateError

        prepared = self.prepare(request)
        if not isinstance(prepared, tuple):
            return prepared
        source, context = prepared
        refusal = self.compile_refusal(source)
        if refusal is not None:
            return refusal
        try:
            load_template(self.env, self.template_name, source)
        except TemplateError as exc:
            return Raised(error_text(exc), RefusalKind.COMPILE)
        self._now = self._parse_now(request.now)
        try:
            text = render_native(self.env, source, context, self.template_name)
        except TemplateError as exc:
            message = raised_by_template(exc)
            if message is not None:
                return Raised(self.raise_format.format(message=message), RefusalKind.RAISE)
            refusal = _cause_of_type(exc, EngineRefusal)
            return Raised(str(refusal) if refusal else error_text(exc), RefusalKind.RENDER)
        except TemplateRaised as exc:
            return Raised(self.raise_format.format(message=exc), RefusalKind.RAISE)
        except EngineRefusal as exc:
            return Raised(str(exc), RefusalKind.RENDER)
        return Rendered(self.finish(text, request))


PYPI_PACKAGE = "minijinja"


def binding_python(version: str):
    """The interpreter of an environment holding `minijinja==version` (this one when it already does)."""
    import sys

    from .versions import ensure_venv

    if version == minijinja_version():
        return sys.executable
    # Wheels only: a source build needs Rust and crates.io.
    return ensure_venv(f"minijinja-{version}", [f"{PYPI_PACKAGE}=={version}"], f"minijinja {version}",
                       pip_options=["--only-binary", PYPI_PACKAGE])


class BindingRunner(CommandRunner):
    """A renderer module of this checkout served by an interpreter holding a given minijinja binding."""

    language = "rust"
    homepage = HOMEPAGE
    module = "runners.minijinja_runner"
    runner_name = "minijinja"
    # A product runner pins the binding it renders with and names the product's version.
    binding_version: Optional[str] = None
    product_version: Optional[str] = None
    imports: tuple = ()   # other runners/ files the renderer module renders with (part of the identity)

    def __init__(self, timeout: float = 20.0, workers: int = 1, version: Optional[str] = None,
                 binding: Optional[str] = None, name: Optional[str] = None, **options):
        from .versions import checkout_harness

        binding = binding or version or self.binding_version
        if binding is None:
            argv, env = python_harness(self.module)
        else:
            argv, env = checkout_harness(self.interpreter(binding), self.module)
        name = name or (f"{self.runner_name}@{version}" if version else self.runner_name)
        super().__init__(argv, name=name, timeout=timeout, workers=workers, env=env, **options)
        self.binding = binding or minijinja_version()
        self.version = self.product_version or self.binding

    @classmethod
    def interpreter(cls, binding: str):
        """The python the harness runs on: one holding the binding (a runner needing more overrides this)."""
        return binding_python(binding)

    def identity(self) -> dict:
        from .identity import python_runner_identity

        # This checkout's renderer module (and what it imports), the binding's exact release, the product.
        files = {self.module.rsplit(".", 1)[-1] + ".py", "minijinja_runner.py", "hf.py", *self.imports}
        identity = python_runner_identity(self.name, sorted(files), product=self.product_version)
        identity["packages"] = {"minijinja": self.binding}  # the binding the harness's interpreter holds
        return identity

    def describe(self) -> dict:
        info = super().describe()
        if self.product_version:  # a reproduction: say which engine renders it
            info["engine"] = f"minijinja (PyPI binding) {self.binding}"
        return info


class MiniJinjaRunner(BindingRunner):
    """The minijinja binding isolated in a harness process; `version` picks a PyPI release of the binding."""


def reads_requests_only(renderer) -> bool:
    """Whether `renderer` only reads what it is handed. MiniJinja's own request path does: the data reaches the
    template as literals the engine builds its own values from (render_native), so cells may share a kept
    conversation. A product's `prepare` or `finish` may change what it is handed, so those get fresh data."""
    kind = type(renderer)
    return all(getattr(kind, step) is getattr(MiniJinjaRenderer, step) for step in ("prepare", "finish", "render"))


def serve_renderer(renderer) -> None:
    from .harness import serve

    serve(renderer.info(), renderer.render, fresh=not reads_requests_only(renderer))


def main() -> None:
    serve_renderer(MiniJinjaRenderer())


if __name__ == "__main__":
    main()
