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
    loop iteration (each `for` iterable is wrapped at parse time), filter call and output chunk, and while
    compiling (every token the lexer yields, every node the code generator visits);
  - a value-size cap checked *before* a value is built wherever a template can grow one by more than a
    constant factor (bounds.py): `*`, `**`, `+`, `%`, `~`, every output `{{ }}` (str of a container with
    shared items), every filter (join, replace, indent, wordwrap, format, tojson, pprint, batch, sum, and
    the input of every filter that stringifies it), str/bytes/int methods (join, replace, expandtabs,
    translate, center/ljust/rjust/zfill, to_bytes), str.format fields and lipsum; results are checked after
    too, and generators a filter consumes are cut at the item cap;
  - an output-size cap enforced while streaming `generate()`, and a bounded `concat` for macro, call-block
    and block-set buffers.
  Deep recursion ends in Python's RecursionError, as it does in HF (reported the same way). What no check
  can see (a single C-level call that is slow) is bounded by the process the render runs in (runner.py:
  every render in a harness process with a memory cap and a time limit).
"""
from __future__ import annotations

import contextvars
import datetime as _dt
import json
import time
import types
from dataclasses import dataclass
from functools import update_wrapper
from typing import Any, Optional

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from markupsafe import EscapeFormatter, Markup, escape

from . import bounds
from .errors import LimitExceeded, OutputLimitError, RenderTimeout

DEFAULT_TIME_LIMIT = 10.0             # seconds per render
COMPILE_TIME_LIMIT = 10.0             # seconds to compile one template (the largest real one: under 1 s)
DEFAULT_MAX_OUTPUT = 32 * 1024 * 1024  # characters of rendered output
DEFAULT_MAX_VALUE = 32 * 1024 * 1024   # characters of any single text built by the template
DEFAULT_MAX_ITEMS = 4 * 1024 * 1024    # items of any single list/tuple/dict built by the template
PRODUCED_FACTOR = 4


@dataclass
class Budget:
    deadline: float
    max_output: int
    max_value: int
    time_limit: float
    now: Optional[_dt.datetime] = None
    max_items: int = DEFAULT_MAX_ITEMS
    activity: str = "render"
    # Text that output expressions produced over the whole render (macro and block buffers hold it until they
    # are joined): at most PRODUCED_FACTOR x max_output.
    produced: int = 0

    def count_produced(self, size: int) -> None:
        self.produced += size
        if self.produced > PRODUCED_FACTOR * self.max_output:
            raise OutputLimitError(f"output expressions produced over {PRODUCED_FACTOR * self.max_output} "
                                   f"characters in this render ({PRODUCED_FACTOR} x the output-size limit)")

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderTimeout(f"{self.activity} exceeded the time limit of {self.time_limit:g} s")

    def check_size(self, value: Any, what: str) -> Any:
        if isinstance(value, (str, bytes)):
            if len(value) > self.max_value:
                raise OutputLimitError(f"{what} built a value of {len(value)} characters, over the value-size "
                                       f"limit of {self.max_value}")
        elif isinstance(value, (list, tuple, dict)) and len(value) > self.max_items:
            raise OutputLimitError(f"{what} built a value of {len(value)} items, over the item limit of "
                                   f"{self.max_items}")
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
    """Holds `guard_iter`, which every `for` iterable is wrapped in so long loops see the deadline, and checks
    the deadline on every token while a template compiles (a huge template cannot compile forever)."""

    @staticmethod
    def guard_iter(iterable):
        iterator = iter(iterable)  # eager: a non-iterable fails here with Python's own message
        budget = _budget.get()
        if budget is None:
            return iterator
        return _guarded(iterator, budget)

    def filter_stream(self, stream):
        budget = _budget.get()
        if budget is None:
            return stream
        return _guarded(stream, budget)


def _guarded(iterator, budget: Budget):
    deadline = budget.deadline
    monotonic = time.monotonic
    for item in iterator:
        if monotonic() > deadline:
            budget.check()
        yield item


def _bounded_items(iterator, budget: Budget, what: str):
    """A generator consumed by a filter: cut at the item limit, deadline checked."""
    count, limit = 0, budget.max_items
    for item in _guarded(iterator, budget):
        count += 1
        if count > limit:
            raise OutputLimitError(f"{what} consumed more than {limit} items (the item limit)")
        yield item


# Filters given a list instead of a generator: their pre-check has to see every item (same result).
_LIST_INPUT_FILTERS = frozenset({"join", "sum"})


def _checked_filter(name: str, func):
    """A filter with the deadline, its pre-check (bounds.FILTER_PRECHECKS), a bound on generators it consumes,
    a text-size check of the input it stringifies, and a size check of what it returns."""
    pass_arg = jinja2.utils._PassArg.from_obj(func)
    at = 0 if pass_arg is None else 1
    precheck = bounds.FILTER_PRECHECKS.get(name)
    stringifies = name in bounds.STRINGIFYING_FILTERS
    what = f"filter {name}"

    def checked(*args, **kwargs):
        budget = _budget.get()
        if budget is None or len(args) <= at:
            return func(*args, **kwargs)
        budget.check()
        value = args[at]
        if isinstance(value, types.GeneratorType):
            value = _bounded_items(value, budget, what)
            if name in _LIST_INPUT_FILTERS:
                value = list(value)
            args = args[:at] + (value,) + args[at + 1:]
        if stringifies and not isinstance(value, str):
            bounds.check_text(value, budget.max_value, f"{what} (its input)")
        if precheck is not None:
            try:
                precheck(budget, _filter_environment(args[0], pass_arg), *args[at:], **kwargs)
            except LimitExceeded:
                raise
            except Exception:  # a bad call: the filter itself refuses it, with the message HF shows
                pass
        result = func(*args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            budget.check_size(result, what)
        return result

    checked.__dict__.update(getattr(func, "__dict__", {}))  # keeps jinja's pass_* markers
    checked.__name__ = getattr(func, "__name__", name)
    return checked


def _filter_environment(first, pass_arg):
    if pass_arg is jinja2.utils._PassArg.environment:
        return first
    if pass_arg is None:
        return environment()
    return getattr(first, "environment", None) or environment()


class _BoundedFormatter(SandboxedFormatter):
    """str.format in the sandbox, with every field's width, precision and text counted before it is built."""

    def vformat(self, format_string, args, kwargs):
        self._produced = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value, format_spec):
        budget = _budget.get()
        if budget is not None:
            budget.check()
            size = estimate = bounds.estimate_text(value, budget.max_value)
            if estimate is None:
                size = budget.max_value + 1
            size = max(size, bounds.format_spec_size(format_spec or ""))
            self._produced = getattr(self, "_produced", 0) + size
            bounds.over(self._produced, budget.max_value, "str.format")
        return super().format_field(value, format_spec)


class _BoundedEscapeFormatter(_BoundedFormatter, EscapeFormatter):
    pass


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
        self.filters = {name: _checked_filter(name, func) for name, func in self.filters.items()}
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

    # -- output and buffers -----------------------------------------------------------------------
    @staticmethod
    def checked_str(value) -> str:
        """str(value) for `{{ }}` output, refused first when the text would be over the value-size limit."""
        budget = _budget.get()
        if type(value) is str:
            if budget is not None:
                budget.count_produced(len(value))
            return value
        if budget is None:
            return str(value)
        budget.check()
        bounds.check_text(value, budget.max_value, "output")
        text = str(value)
        budget.count_produced(len(text))
        return text

    @staticmethod
    def checked_escape(value):
        budget = _check()
        if budget is not None and not isinstance(value, str):
            bounds.check_text(value, budget.max_value, "output")
        result = escape(value)
        if budget is not None:
            budget.check_size(result, "output")
        return result

    @staticmethod
    def concat(parts) -> str:
        """"".join for macro, caller and block-set buffers (and the root stream), with the size checked first."""
        budget = _budget.get()
        if budget is None:
            return "".join(parts)
        if not isinstance(parts, list):
            parts = list(parts)
        bounds.over(sum(len(part) for part in parts), budget.max_value, "a macro or block")
        return "".join(parts)

    # -- sandbox hooks --------------------------------------------------------------------------
    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's own naming
        budget = _check()
        if budget is not None:
            if args and isinstance(args[0], types.GeneratorType) and getattr(__obj, "__name__", "") == "join" \
                    and isinstance(getattr(__obj, "__self__", None), (str, bytes)):
                # str.join of a generator: its items are counted first (the same text comes out).
                args = (list(_bounded_items(args[0], budget, "a call")),) + args[1:]
            bounds.method_precheck(budget, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        if budget is not None and isinstance(result, (str, bytes, list, tuple, dict)):
            budget.check_size(result, "a call")
        return result

    def wrap_str_format(self, value):
        # jinja2's own wrap_str_format with a formatter that counts what each field will print.
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) \
                or value.__name__ not in ("format", "format_map"):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"
        if isinstance(f_self, Markup):
            formatter = _BoundedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = _BoundedFormatter(self)

        def wrapper(*args, **kwargs):
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs = args[0]
                args = ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)

    def getattr(self, obj, attribute):
        _check()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _check()
        return super().getitem(obj, argument)

    def call_binop(self, context, op, left, right):
        budget = _check()
        if budget is not None:
            _precheck_binop(budget, op, left, right)
        result = self.binop_table[op](left, right)
        if budget is not None and type(result) is not int and isinstance(result, _SEQUENCES):
            budget.check_size(result, f"operator {op!r}")
        return result


_SEQUENCES = (str, bytes, list, tuple)


def _precheck_binop(budget: Budget, op: str, left, right) -> None:
    # Runs for every intercepted operator: exact types first (the common cases), isinstance only after.
    if op == "*":
        if type(right) is int:
            seq, count = left, right
        elif type(left) is int:
            seq, count = right, left
        else:
            return
        if type(seq) is int:
            if seq.bit_length() + count.bit_length() > _MAX_BITS:
                raise OutputLimitError(f"operator '*' would build an integer of about "
                                       f"{seq.bit_length() + count.bit_length()} bits, over the value-size limit")
        elif isinstance(seq, _SEQUENCES):
            limit = budget.max_value if isinstance(seq, (str, bytes)) else budget.max_items
            if len(seq) * count > limit:
                raise OutputLimitError(f"operator '*' would build {len(seq) * count} items/characters, over "
                                       f"the limit of {limit}")
    elif op == "+":
        if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            limit = budget.max_value if isinstance(left, (str, bytes)) else budget.max_items
            if len(left) + len(right) > limit:
                raise OutputLimitError(f"operator '+' would build {len(left) + len(right)} items/characters, "
                                       f"over the limit of {limit}")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            bits = right * max(1, abs(left).bit_length())
            if bits > _MAX_BITS:
                raise OutputLimitError(f"operator '**' would build an integer of about {bits} bits, over the value-size limit")
    elif op == "%" and isinstance(left, str):
        bounds.over(bounds.percent_size(left, right, budget.max_value), budget.max_value, "operator '%'")


_MAX_BITS = 1_000_000


def str_join_checked(seq):
    budget = _check()
    if budget is None:
        return "".join(map(str, seq))
    if not isinstance(seq, (list, tuple)):
        seq = list(seq)
    total = 0
    for part in seq:
        if type(part) is str:
            total += len(part)
        else:
            size = bounds.estimate_text(part, budget.max_value)
            total += budget.max_value + 1 if size is None else size
        if total > budget.max_value:
            raise OutputLimitError(f"operator '~' would build more than {budget.max_value} characters, over the "
                                   f"value-size limit")
    return "".join(map(str, seq))


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
