"""Size accounting: what a value will cost, known before the evaluator builds it.

A template can ask for a huge value in a handful of characters: `(['x'*10**7]*300)|join` (3 GB from a
300-item list of one shared string), `x|tojson(indent=10**9)`, `'{:>999999999}'.format(1)`, `s|replace('',
big)`. Checking a result after it was built is too late, so every place where the evaluator turns values into
text or multiplies them is checked first, against estimates that never fall below the real size by more than a
small constant factor (escaping) and never walk a shared object twice:

  - `estimate_text(value)`: the length of str(value) (repr of the items of a container), shared objects
    counted once per occurrence without being walked again (memoised by id);
  - `json_size(value, indent, separators)`: json.dumps' length, indentation included (lines x depth x indent);
  - `percent_size`/`format_field_size`: widths and precisions of %-formats and format specs;
  - per-filter and per-method pre-checks (`FILTER_PRECHECKS`, `method_precheck`) for everything that grows
    its input by more than a constant factor (join, replace, indent, wordwrap, batch, sum, str.join,
    str.replace, str.expandtabs, str.translate, int.to_bytes, lipsum, ...).

Everything over the limit raises OutputLimitError (a LimitExceeded: the runner reports Errored). The estimates
only decide whether to refuse; the value itself is still built by the same code HF runs, so a successful
render is unchanged.
"""
from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Callable, Optional

import jinja2.utils
from jinja2.runtime import Undefined

from .errors import OutputLimitError

# Width and precision digits beyond this are refused without converting them to an int.
_MAX_DIGITS = 12


class _Over(Exception):
    pass


def _digits(value: int) -> int:
    return int(abs(value).bit_length() * 0.30103) + 2


class _TextEstimator:
    """len(str(value)) for top-level values, len(repr(item)) inside containers, with early exit at `limit`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.memo: dict = {}
        self.active: set = set()

    def top(self, value) -> int:
        if isinstance(value, str):
            return len(value)
        if isinstance(value, Undefined):
            return 0
        return self.item(value)

    def item(self, value) -> int:
        if isinstance(value, str):
            return len(value) + 2
        if value is None or isinstance(value, (bool, float)):
            return 24
        if isinstance(value, int):
            return _digits(value)
        if isinstance(value, (bytes, bytearray)):
            return 3 + 4 * len(value)
        key = id(value)
        known = self.memo.get(key)
        if known is not None:
            return known
        if key in self.active:  # a cycle: repr prints "[...]"
            return 5
        if isinstance(value, (list, tuple, set, frozenset, Mapping, types.MappingProxyType)) or _is_view(value) \
                or isinstance(value, jinja2.utils.Namespace):
            self.active.add(key)
            try:
                size = self._container(value)
            finally:
                self.active.discard(key)
        else:
            size = 80  # any other object prints as a short description (<function ...>, a loop, a macro)
        self.memo[key] = size
        return size

    def _container(self, value) -> int:
        size = 16
        if isinstance(value, jinja2.utils.Namespace):
            value = _namespace_attrs(value)
        if isinstance(value, Mapping):
            for k, v in value.items():
                size += self.item(k) + self.item(v) + 4
                if size > self.limit:
                    raise _Over
            return size
        for item in value:
            size += self.item(item) + 2
            if size > self.limit:
                raise _Over
        return size


def _is_view(value) -> bool:
    return isinstance(value, (type({}.keys()), type({}.values()), type({}.items())))


def _namespace_attrs(value) -> dict:
    attrs = getattr(value, "_Namespace__attrs", None)
    return attrs if isinstance(attrs, dict) else {}


def estimate_text(value, limit: int) -> Optional[int]:
    """Estimated len(str(value)), or None when it is over `limit` (the walk stops there)."""
    try:
        return _TextEstimator(limit).top(value)
    except _Over:
        return None
    except RecursionError:  # nested deeper than str() itself can go: let str() fail the way HF's does
        return 0


def check_text(value, limit: int, what: str) -> None:
    """Refuse before str(value) when its text would be over `limit` characters."""
    if isinstance(value, str):
        if len(value) > limit:
            raise OutputLimitError(f"{what} would build a text of {len(value)} characters, over the value-size "
                                   f"limit of {limit}")
        return
    if estimate_text(value, limit) is None:
        raise OutputLimitError(f"{what} would turn a value into a text of more than {limit} characters (the "
                               f"value-size limit)")


def over(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise OutputLimitError(f"{what} would build {size} items/characters, over the value-size limit of {limit}")


# -- JSON --------------------------------------------------------------------------------------------------

class _JSONLayout:
    """Per node: (flat characters, lines, sum of the lines' depths below the node); memoised by id."""

    def __init__(self, limit: int, item_sep: int, key_sep: int):
        self.limit = limit
        self.item_sep = item_sep
        self.key_sep = key_sep
        self.memo: dict = {}
        self.active: set = set()

    def node(self, value) -> tuple:
        if isinstance(value, str):
            return len(value) + 2, 0, 0
        if value is None or isinstance(value, (bool, int, float)):
            return (_digits(value) if isinstance(value, int) and not isinstance(value, bool) else 24), 0, 0
        if not isinstance(value, (list, tuple, dict)):
            return 24, 0, 0  # json.dumps refuses it (TypeError), as in HF
        key = id(value)
        known = self.memo.get(key)
        if known is not None:
            return known
        if key in self.active:  # json.dumps raises "Circular reference detected"
            return 0, 0, 0
        self.active.add(key)
        try:
            flat, lines, weighted = 2, 0, 0
            children = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
            for name, child in children:
                c_flat, c_lines, c_weighted = self.node(child)
                if name is not None:
                    c_flat += self.node(name)[0] + self.key_sep
                flat += c_flat + self.item_sep
                lines += 1 + c_lines
                weighted += 1 + c_weighted + c_lines
                if flat > self.limit:
                    raise _Over
            if children:
                lines += 1  # the closing bracket's line
        finally:
            self.active.discard(key)
        self.memo[key] = (flat, lines, weighted)
        return flat, lines, weighted


def json_size(value, limit: int, indent=None, separators=None) -> Optional[int]:
    """Estimated len(json.dumps(value, indent=..., separators=...)), or None when over `limit`."""
    if isinstance(indent, int) and not isinstance(indent, bool):
        indent_len = max(indent, 0)
    elif isinstance(indent, str):
        indent_len = len(indent)
    else:
        indent_len = 0
    item_sep, key_sep = 2, 2
    if isinstance(separators, (tuple, list)) and len(separators) == 2:
        item_sep = len(separators[0]) if isinstance(separators[0], str) else 2
        key_sep = len(separators[1]) if isinstance(separators[1], str) else 2
    if indent_len > limit:
        return None
    try:
        flat, lines, weighted = _JSONLayout(limit, item_sep, key_sep).node(value)
    except _Over:
        return None
    except RecursionError:
        return 0
    total = flat + (lines + weighted * indent_len if indent is not None else 0)
    return None if total > limit else total


def pprint_size(value, limit: int) -> Optional[int]:
    """pprint.pformat indents nested lines by up to the enclosing keys' width: bounded by the widest key."""
    estimator = _TextEstimator(limit)
    try:
        flat = estimator.top(value)
        layout = _JSONLayout(limit, 2, 2)
        _, lines, weighted = layout.node(value) if isinstance(value, (list, tuple, dict)) else (0, 0, 0)
    except _Over:
        return None
    except RecursionError:
        return 0
    widest = max((len(k) + 4 for k in _keys(value, set()) if isinstance(k, str)), default=4)
    total = flat + lines + weighted * widest
    return None if total > limit else total


def _keys(value, seen: set):
    if id(value) in seen:
        return
    if isinstance(value, dict):
        seen.add(id(value))
        for k, v in value.items():
            yield k
            yield from _keys(v, seen)
    elif isinstance(value, (list, tuple)):
        seen.add(id(value))
        for v in value:
            yield from _keys(v, seen)


# -- format strings ----------------------------------------------------------------------------------------

_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d*))?", re.S)


def _number(digits: Optional[str]) -> int:
    if not digits:
        return 0
    if len(digits) > _MAX_DIGITS:
        return 10 ** _MAX_DIGITS
    return int(digits)


def percent_size(fmt: str, args, limit: int) -> int:
    """Estimated len(fmt % args): every directive's width, precision and converted argument."""
    if isinstance(args, tuple):
        positional, mapping = list(args), None
    elif isinstance(args, Mapping):
        positional, mapping = [args], args
    else:
        positional, mapping = [args], None
    total, index = len(fmt), 0

    def take():
        nonlocal index
        value = positional[index] if index < len(positional) else None
        index += 1
        return value

    for match in _PERCENT.finditer(fmt):
        key, width, precision, conversion = match.groups()
        if conversion == "%":
            continue
        w = take() if width == "*" else _number(width)
        p = take() if precision == "*" else _number(precision)
        w = w if isinstance(w, int) else 0
        p = p if isinstance(p, int) else 0
        arg = mapping.get(key) if key is not None and mapping is not None else take()
        if conversion in ("s", "r", "a"):
            size = estimate_text(arg, limit)
            size = limit + 1 if size is None else size
        else:
            size = p + (_digits(arg) if isinstance(arg, int) else 32)
        total += max(abs(w), size)
        if total > limit:
            break
    return total


def format_spec_size(spec: str) -> int:
    """The width or precision a format spec asks for (str.format's per-field minimum)."""
    match = _SPEC.match(spec)
    if not match:
        return 0
    return max(_number(match.group(1)), _number(match.group(2)))


# -- filters -----------------------------------------------------------------------------------------------

def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _join(budget, env, value, d="", attribute=None):
    if not isinstance(value, (list, tuple)):
        return
    items = value
    if attribute is not None:
        from jinja2.filters import make_attrgetter

        getter = make_attrgetter(env, attribute)
        items = [getter(item) for item in value]
    sep = len(str(d)) if d else 0
    limit = budget.max_value
    total = max(len(items) - 1, 0) * sep
    estimator = _TextEstimator(limit)
    try:
        for item in items:
            total += estimator.top(item)
            if total > limit:
                raise _Over
    except _Over:
        raise OutputLimitError(f"filter join would build a text of more than {limit} characters (the value-size "
                               f"limit)") from None
    except RecursionError:
        return


def _replace(budget, env, s, old, new, count=None):
    s, old, new = _text(s), str(old) if old is not None else "", str(new) if new is not None else ""
    growth = len(new) - len(old)
    if growth <= 0:
        return
    occurrences = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        occurrences = min(occurrences, count)
    over(len(s) + occurrences * growth, budget.max_value, "filter replace")


def _indent(budget, env, s, width=4, first=False, blank=False):
    w = len(width) if isinstance(width, str) else (width if isinstance(width, int) else 0)
    s = _text(s)
    over(len(s) + (s.count("\n") + 1) * max(w, 0), budget.max_value, "filter indent")


def _center(budget, env, value, width=80):
    if isinstance(width, int):
        over(width, budget.max_value, "filter center")


def _wordwrap(budget, env, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    s = _text(s)
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 2
    breaks = min(len(s), len(s) // max(width, 1) + s.count(" ") + s.count("\n") + 1) if isinstance(width, int) \
        else len(s)
    over(len(s) + breaks * wrap, budget.max_value, "filter wordwrap")


def _format(budget, env, value, *args, **kwargs):
    if isinstance(value, str):
        over(percent_size(value, kwargs or args, budget.max_value), budget.max_value, "filter format")


def _tojson(budget, env, x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    if json_size(x, budget.max_value, indent, separators) is None:
        raise OutputLimitError(f"filter tojson would build more than {budget.max_value} characters (the "
                               f"value-size limit)")


def _pprint(budget, env, value):
    if pprint_size(value, budget.max_value) is None:
        raise OutputLimitError(f"filter pprint would build more than {budget.max_value} characters (the "
                               f"value-size limit)")


def _batch(budget, env, value, linecount, fill_with=None):
    if fill_with is not None and isinstance(linecount, int):
        over(linecount, budget.max_items, "filter batch")


def _slice(budget, env, value, slices, fill_with=None):
    if isinstance(slices, int):
        over(slices, budget.max_items, "filter slice")


def _sum(budget, env, iterable, attribute=None, start=0):
    if attribute is not None or not isinstance(iterable, (list, tuple)):
        return
    total = len(start) if isinstance(start, (list, tuple)) else 0
    for item in iterable:
        if isinstance(item, (list, tuple)):
            total += len(item)
    over(total, budget.max_items, "filter sum")


FILTER_PRECHECKS: dict[str, Callable] = {
    "join": _join, "replace": _replace, "indent": _indent, "center": _center, "wordwrap": _wordwrap,
    "format": _format, "tojson": _tojson, "pprint": _pprint, "batch": _batch, "slice": _slice,
    "sum": _sum,
}  # each called as check(budget, environment, <the filter's own arguments>)

# Filters that turn their input into text first (soft_str/str/escape): the input's text is checked.
STRINGIFYING_FILTERS = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "lower", "replace", "safe",
    "string", "striptags", "title", "trim", "truncate", "upper", "urlize", "wordcount", "wordwrap",
    "urlencode", "xmlattr",
})
# Filters that consume an iterable whole (the rest are lazy or read a bounded prefix).
MATERIALISING_FILTERS = frozenset({"join", "list", "sort", "unique", "dictsort", "groupby", "reverse", "sum",
                                   "max", "min", "batch", "slice", "length", "count", "last"})


# -- methods -----------------------------------------------------------------------------------------------

def method_precheck(budget, method, args: tuple, kwargs: dict) -> None:
    """Pre-checks for the str/bytes/int methods a template can call that grow their input."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    limit = budget.max_value
    if isinstance(owner, (str, bytes, bytearray)):
        if name in ("center", "ljust", "rjust", "zfill"):
            width = args[0] if args else kwargs.get("width")
            if isinstance(width, int):
                over(width, limit, f"str.{name}")
        elif name == "join" and args and isinstance(args[0], (list, tuple)):
            items = args[0]
            total = len(owner) * max(len(items) - 1, 0)
            for item in items:
                if isinstance(item, (str, bytes, bytearray)):
                    total += len(item)
                    if total > limit:
                        break
            over(total, limit, f"{type(owner).__name__}.join")
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, type(owner)) and isinstance(new, type(owner)) and len(new) > len(old):
                occurrences = len(owner) + 1 if not old else owner.count(old)
                count = args[2] if len(args) > 2 else kwargs.get("count", -1)
                if isinstance(count, int) and count >= 0:
                    occurrences = min(occurrences, count)
                over(len(owner) + occurrences * (len(new) - len(old)), limit, f"{type(owner).__name__}.replace")
        elif name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
                over(len(owner) + tabs * max(size, 0), limit, "str.expandtabs")
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
            over(len(owner) * max(longest, 1), limit, "str.translate")
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int):
            over(length, limit, "int.to_bytes")
    elif method is jinja2.utils.generate_lorem_ipsum:
        n = args[0] if args else kwargs.get("n", 5)
        most = args[3] if len(args) > 3 else kwargs.get("max", 100)
        if isinstance(n, int) and isinstance(most, int):
            over(n * max(most, 1) * 12, limit, "lipsum")
