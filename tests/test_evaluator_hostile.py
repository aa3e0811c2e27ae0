"""Hostile templates: sandbox escapes are refused; runaway work ends in a clear error within the bounds."""
from __future__ import annotations

import time

import pytest

from runners.base import Errored, Raised, RenderRequest
from runners.evaluator import (
    ChatTemplate,
    LimitExceeded,
    RenderTimeout,
    SecurityViolation,
)
from runners.evaluator.runner import EvaluatorRunner

MESSAGES = [{"role": "user", "content": "hi"}]
TIME_LIMIT = 1.0
SLACK = 10.0  # generous: the machine is shared; the point is "bounded", not "fast"

ESCAPES = {
    "class-walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "type-init-globals": "{{ cycler.__init__.__globals__ }}",
    "namespace-dunder": "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "list-mutation": "{{ messages.append(1) }}",
    "dict-mutation": "{{ messages[0].update({'role': 'system'}) }}",
    "format-attribute": "{{ '{0.__class__.__init__.__globals__}'.format(messages) }}",
}

RUNAWAY = {
    "range-10e9": ("{{ range(10**9)|length }}", "raised"),
    "nested-loops": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "timeout"),
    "infinite-recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "raised"),
    "recursive-loop": ("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}", "raised"),
    "gigabyte-output": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 100 }}{% endfor %}"
                        "{% endfor %}", "limit"),
    "gigabyte-string": ("{{ 'x' * 10**9 }}", "limit"),
    "doubling-concat": ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}", "limit"),
    "doubling-list": ("{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}", "bounded"),
    "huge-power": ("{{ 7 ** 1000000000 }}", "limit"),
    "huge-center": ("{{ 'x'|center(10**10) }}", "limit"),
    "huge-ljust": ("{{ 'x'.ljust(10**10) }}", "limit"),
}


@pytest.fixture(scope="module")
def bounded():
    """One evaluator harness for the module, with a short time limit (every render is out of process)."""
    with EvaluatorRunner(timeout=TIME_LIMIT, max_output=8 * 1024 * 1024) as runner:
        yield runner


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_is_refused(name, bounded):
    outcome = bounded.render(RenderRequest.make(ESCAPES[name], MESSAGES))
    if isinstance(outcome, Raised):
        assert outcome.message.startswith(("SecurityError", "UndefinedError")), outcome
    else:  # an unsafe attribute that is only printed renders as empty undefined, never the object
        assert outcome.kind == "rendered" and "function" not in outcome.text and "class" not in outcome.text


def test_escape_raises_a_typed_security_error():
    with pytest.raises(SecurityViolation, match="__class__"):
        ChatTemplate.from_string("{{ ''.__class__.__mro__ }}").render(MESSAGES)


@pytest.mark.parametrize("name", sorted(RUNAWAY))
def test_runaway_template_is_bounded(name, bounded):
    source, expected = RUNAWAY[name]
    started = time.monotonic()
    outcome = bounded.render(RenderRequest.make(source, MESSAGES))
    elapsed = time.monotonic() - started
    assert elapsed < TIME_LIMIT + SLACK, f"{name} took {elapsed:.1f} s"
    if expected == "raised":
        assert isinstance(outcome, Raised) and outcome.message.split(":")[0] in ("OverflowError", "RecursionError")
    elif expected == "timeout":
        assert isinstance(outcome, Errored) and outcome.timed_out and "time limit" in outcome.message
    elif expected == "bounded":  # size or time limit, whichever the machine reaches first
        assert isinstance(outcome, Errored) and "limit" in outcome.message, outcome
    else:
        assert isinstance(outcome, Errored) and not outcome.timed_out and "limit" in outcome.message, outcome


def test_limits_are_typed_errors():
    with pytest.raises(RenderTimeout):
        ChatTemplate.from_string(RUNAWAY["nested-loops"][0]).render(MESSAGES, time_limit=0.3)
    with pytest.raises(LimitExceeded, match="output-size limit"):
        ChatTemplate.from_string("{% for i in range(1000) %}{{ 'y' * 100 }}{% endfor %}").render(
            MESSAGES, max_output=1000)
