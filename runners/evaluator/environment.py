"""The Jinja environment: transformers 5.24.0's chat-template environment, rebuilt, plus bounds.

What HF builds in `_cached_compile_jinja_template`, reproduced here:
  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[<generation tag>, jinja2.ext.loopcontrols])
  filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)   (no HTML escaping)
  globals: raise_exception -> jinja2 TemplateError(message); strftime_now(fmt) -> datetime.now().strftime(fmt)
           (here: the request's frozen clock); dict -> a callable object with only __call__ and fromkeys;
           namespace -> jinja2 Namespace that rejects underscore-prefixed names with SecurityError.
  `{% generation %}...{% endgeneration %}` parses to a CallBlock whose function returns caller() unchanged.

Bounds added on top (they never change a successful render):
  - a deadline checked on every sandbox call, attribute/item lookup, intercepted operator, `~` concat,
    loop iteration (each `for` iterable is wrapped at parse time) and output chunk;
  - a value-size cap on `*`, `**`, `+`, `%`, `~` and call results, and pre-checks on width arguments of
    str.center/ljust/rjust/zfill and the center/indent filters, so no single value grows past the cap;
  - an output-size cap enforced while streaming `generate()`.
  Deep recursion ends in Python's RecursionError, as it does in HF (reported the same way).
"""
from __future__ import annotations

import contextvars
import datetime as _dt
import json
import time
from dataclasses import dataclass
from typing import Any, Optional

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import OutputLimitError, RenderTimeout

DEFAULT_TIME_LIMIT = 10.0             # seconds per render
DEFAULT_MAX_OUTPUT = 32 * 1024 * 1024  # characters of rendered output
DEFAULT_MAX_VALUE = 32 * 1024 * 1024   # characters/items of any single value built by the template


@dataclass
class Budget:
    deadline: float
    max_output: int
    max_value: int
    time_limit: float
    now: Optional[_dt.datetime] = None

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderTimeout(f"render exceeded the time limit of {self.time_limit:g} s")

    def check_size(self, value: Any, what: str) -> Any:
        if isinstance(value, (str, list, tuple, dict)) and len(value) > self.max_value:
            raise OutputLimitError(f"{what} built a value of {len(value)} items/characters, over the "
                                   f"value-size limit of {self.max_value}")
        return value


_budget: contextvars.ContextVar[Optional[Budget]] = contextvars.ContextVar("chatgold_evaluator_budget",
                                                                            default=None)


def active_budget() -> Optional[Budget]:
    return _budget.get()


def set_budget(budget: Budget):
    return _budget.set(budget)


def reset_budget(token) -> None:
    _budget.reset(token)


def _check() -> Optional[Budget]:
    budget = _budget.get()
    if budget is not None:
        budget.check()
    return budget


# -- HF's template globals and filters -------------------------------------------------------------

def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF replaces Jinja's tojson: no HTML escaping, and the json.dumps options exposed.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    # HF calls datetime.now() (the machine's local wall clock); the suite freezes it to the case's naive
    # UTC time (runners/hf.py parse_now), so the evaluator uses the same frozen value.
    budget = _budget.get()
    now = budget.now if budget is not None and budget.now is not None else _dt.datetime.now()
    return now.strftime(format)


class TemplateDict:
    """`dict` for templates: calling it builds a dict; nothing else is reachable (as HF's TemplateDict)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """jinja2 Namespace that refuses underscore-prefixed attribute names (HF's TemplateNamespace)."""

    def __init__(*args, **kwargs):  # noqa: N805 - same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


# Undefined-attribute messages name the object's module ("'transformers.utils.chat_template_utils.TemplateDict
# object' has no attribute 'x'"); HF defines these classes in that module, so ours claim it too.
TemplateDict.__module__ = "transformers.utils.chat_template_utils"
TemplateNamespace.__module__ = "transformers.utils.chat_template_utils"


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}` marks assistant text for HF's token masks; for plain rendering it is transparent."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


class LoopGuard(jinja2.ext.Extension):
    """Holds `guard_iter`, which every `for` iterable is wrapped in so long loops see the deadline."""

    @staticmethod
    def guard_iter(iterable):
        iterator = iter(iterable)  # eager: a non-iterable fails here with Python's own message
        budget = _budget.get()
        if budget is None:
            return iterator
        return _guarded(iterator, budget)


def _guarded(iterator, budget: Budget):
    deadline = budget.deadline
    monotonic = time.monotonic
    for item in iterator:
        if monotonic() > deadline:
            budget.check()
        yield item


_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})


def _width_checked(method, name: str):
    def checked(*args, **kwargs):
        budget = _budget.get()
        width = args[0] if args else kwargs.get("width")
        if budget is not None and isinstance(width, int) and width > budget.max_value:
            raise OutputLimitError(f"str.{name}({width}) would exceed the value-size limit of {budget.max_value}")
        return method(*args, **kwargs)
    return checked


class ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """HF's sandbox plus deadline/size checks on every hook the sandbox already routes through."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    checked_str_join = staticmethod(lambda seq: str_join_checked(seq))

    def __init__(self, **options):
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[GenerationTag, jinja2.ext.loopcontrols, LoopGuard], **options)
        self.filters["tojson"] = tojson
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now
        self.globals["dict"] = TemplateDict()
        self.globals["namespace"] = TemplateNamespace
        for name in ("center", "indent"):
            self.filters[name] = _filter_width_checked(self.filters[name], name)
        self._loop_guard_id = LoopGuard.identifier

    # -- parsing: wrap each for-loop iterable in guard_iter ---------------------------------------
    def parse_plain(self, source: str) -> nodes.Template:
        """The AST exactly as jinja2 parses it (no loop guards): for inventories and tracing names."""
        try:
            return super()._parse(source, None, None)
        except jinja2.TemplateSyntaxError:
            self.handle_exception(source=source)

    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            guard = nodes.ExtensionAttribute(self._loop_guard_id, "guard_iter", lineno=loop.iter.lineno)
            loop.iter = nodes.Call(guard, [loop.iter], [], None, None, lineno=loop.iter.lineno)
        return tree

    # -- sandbox hooks --------------------------------------------------------------------------
    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's own naming
        budget = _check()
        result = super().call(__context, __obj, *args, **kwargs)
        if budget is not None and isinstance(result, (str, list)) and len(result) > budget.max_value:
            budget.check_size(result, "a call")
        return result

    def getattr(self, obj, attribute):
        _check()
        value = super().getattr(obj, attribute)
        if attribute in _WIDTH_METHODS and isinstance(obj, str) and callable(value):
            return _width_checked(value, attribute)
        return value

    def getitem(self, obj, argument):
        _check()
        return super().getitem(obj, argument)

    def call_binop(self, context, op, left, right):
        budget = _check()
        if budget is not None:
            _precheck_binop(budget, op, left, right)
        result = self.binop_table[op](left, right)
        if budget is not None and isinstance(result, (str, list, tuple)) and len(result) > budget.max_value:
            budget.check_size(result, f"operator {op!r}")
        return result


def _filter_width_checked(filter_func, name: str):
    def checked(*args, **kwargs):
        budget = _budget.get()
        if budget is not None:
            width = args[1] if len(args) > 1 else kwargs.get("width")
            if isinstance(width, int) and width > budget.max_value:
                raise OutputLimitError(f"filter {name}({width}) would exceed the value-size limit of "
                                       f"{budget.max_value}")
        return filter_func(*args, **kwargs)
    checked.__dict__.update(getattr(filter_func, "__dict__", {}))  # keeps jinja's pass_* markers
    return checked


def _precheck_binop(budget: Budget, op: str, left, right) -> None:
    if op == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and not isinstance(count, bool):
                if len(seq) * count > budget.max_value:
                    raise OutputLimitError(f"operator '*' would build {len(seq) * count} items/characters, over "
                                           f"the value-size limit of {budget.max_value}")
    elif op == "+":
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if len(left) + len(right) > budget.max_value:
                raise OutputLimitError(f"operator '+' would build {len(left) + len(right)} items/characters, "
                                       f"over the value-size limit of {budget.max_value}")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            bits = right * max(1, abs(left).bit_length())
            if bits > 1_000_000:
                raise OutputLimitError(f"operator '**' would build an integer of about {bits} bits, over the value-size limit")


def str_join_checked(seq):
    budget = _check()
    result = "".join(map(str, seq))
    if budget is not None and len(result) > budget.max_value:
        budget.check_size(result, "operator '~'")
    return result


_ENVIRONMENT: Optional[ChatTemplateEnvironment] = None


def environment() -> ChatTemplateEnvironment:
    """The shared plain environment (compiled templates are cached per source by the caller)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        from .codegen import BoundedCodeGenerator

        env = ChatTemplateEnvironment()
        env.code_generator_class = BoundedCodeGenerator
        _ENVIRONMENT = env
    return _ENVIRONMENT
