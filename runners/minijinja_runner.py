"""MiniJinja (the Rust engine inside TGI and mistral.rs) through its Python binding, `minijinja` on PyPI.

Configured the way Rust embedders configure it for chat templates: trim_blocks and lstrip_blocks (as HF's
jinja2 environment), lenient undefined, the Python-compatible methods (minijinja-contrib's pycompat:
`.items()`, `.startswith()`, ...), `raise_exception` and `strftime_now` added as functions, and minijinja's
*own* `tojson`. Nothing else is patched: where minijinja differs from jinja2 (no `tojson(ensure_ascii=...)`,
no `{% generation %}`, its own error texts, `true` printed as `true`) the difference is the point.

Variables are bound as HF's apply_chat_template binds them: messages, tools, documents,
add_generation_prompt, bos_token/eos_token only when the model has them, then the extra kwargs.
`continue_final_message` is HF's post-processing of the rendered text, not a template feature, and no
minijinja embedder offers it: such cells are Skipped.

Runs in a harness process (python -m runners.minijinja_runner) so a hostile template is bounded.
"""
from __future__ import annotations

import json
import re
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


def render_native(env, source: str, context: dict, name: str = "chat_template") -> str:
    """Render `source` with `context` bound as *native* MiniJinja values, as a Rust embedder's serde data is.

    The Python binding would otherwise hand the template live Python dicts and lists (Python repr, Python
    methods such as .pop(), mutation), which no Rust embedder exposes. So the data travels as literals in a
    root template that sets each variable and includes the chat template unchanged.
    """
    load_template(env, name, source)  # a syntax error raises here
    sets = []
    for key, value in context.items():
        if not _IDENTIFIER.match(key) or key in _RESERVED:
            continue  # cannot be named by a template anyway
        sets.append(f"{{% set {key} = {minijinja_literal(value)} %}}")
    env.add_template("chatgold_root", "".join(sets) + "{% include " + json.dumps(name) + " %}")
    try:
        return env.render_template("chatgold_root")
    finally:
        env.remove_template("chatgold_root")


def error_text(exc) -> str:
    """The engine's own message for the failure inside the chat template (the include wrapper peeled off)."""
    causes = [line[len("caused by: "):] for line in str(exc).splitlines() if line.startswith("caused by: ")]
    return causes[-1] if causes else exc.message


def raised_by_template(exc) -> Optional[str]:
    cause = exc
    while cause is not None:
        if isinstance(cause, TemplateRaised):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None


class MiniJinjaRenderer:
    """Renders in this process. Use MiniJinjaRunner for the bounded, isolated form."""

    def __init__(self):
        from minijinja import Environment

        from .hf import parse_now

        self._parse_now = parse_now
        self._now = None
        self.env = Environment(
            trim_blocks=True,
            lstrip_blocks=True,
            undefined_behavior="lenient",
            pycompat=True,
            debug=False,  # debug output dumps the whole context into every error
            globals={"raise_exception": self._raise_exception, "strftime_now": self._strftime_now},
        )
        self.version = minijinja_version()

    @staticmethod
    def _raise_exception(message=""):
        raise TemplateRaised(str(message))

    def _strftime_now(self, fmt):
        # The case's frozen clock as naive UTC wall-clock time, as HF's strftime_now sees it on a UTC machine.
        return self._now.strftime(str(fmt))

    def render(self, request: RenderRequest) -> Outcome:
        from minijinja import TemplateError

        if request.continue_final_message:
            return Skipped("continue_final_message is apply_chat_template post-processing; minijinja embedders have none")
        try:
            load_template(self.env, "chat_template", request.template)
        except TemplateError as exc:
            return Raised(error_text(exc), RefusalKind.COMPILE)
        context = {}
        if request.bos_token is not None:
            context["bos_token"] = request.bos_token
        if request.eos_token is not None:
            context["eos_token"] = request.eos_token
        context.update(request.kwargs)
        context.update(messages=request.messages, tools=request.tools, documents=request.documents,
                       add_generation_prompt=request.add_generation_prompt)
        self._now = self._parse_now(request.now)
        try:
            return Rendered(render_native(self.env, request.template, context))
        except TemplateError as exc:
            message = raised_by_template(exc)
            if message is not None:
                return Raised(message, RefusalKind.RAISE)
            return Raised(error_text(exc), RefusalKind.RENDER)
        except TemplateRaised as exc:
            return Raised(str(exc), RefusalKind.RAISE)


class MiniJinjaRunner(CommandRunner):
    """MiniJinja isolated in a harness process."""

    language = "rust"
    homepage = HOMEPAGE

    def __init__(self, timeout: float = 20.0, workers: int = 1, **options):
        argv, env = python_harness("runners.minijinja_runner")
        super().__init__(argv, name="minijinja", timeout=timeout,
                         workers=workers, env=env, **options)
        self.version = minijinja_version()


def main() -> None:
    from .harness import serve

    renderer = MiniJinjaRenderer()
    serve({"name": "minijinja", "version": renderer.version, "language": "rust", "homepage": HOMEPAGE},
          renderer.render)


if __name__ == "__main__":
    main()
