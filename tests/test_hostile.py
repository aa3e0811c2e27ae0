"""Hostile templates through every in-process/harness runner: escapes fail, limits hold, the run goes on.

Each runner renders a batch of hostile cells followed by a normal cell. A hostile cell must end as a status
(Raised, or Errored/timed out) or as a harmless, bounded rendering; the normal cell after it must render.
"""
from __future__ import annotations

import importlib.util
import time

import pytest

from runners import Errored, Raised, Rendered, RenderRequest, get_runner

TIME_LIMIT = 8.0           # per cell, passed to each runner
MAX_HARMLESS_OUTPUT = 10 * 1024 * 1024
MESSAGES = [{"role": "user", "content": "hello"}]
NORMAL = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"


def hostile_templates(marker: str) -> dict[str, str]:
    """name -> template. `marker` is a file an escape would create."""
    shell = f"touch {marker}"
    return {
        "cycler-globals-os": "{{ cycler.__init__.__globals__.os.system('" + shell + "') }}",
        "joiner-globals": "{{ joiner.__init__.__globals__['__builtins__']['__import__']('os').system('" + shell + "') }}",
        "namespace-globals": "{% set ns = namespace() %}{{ ns.__init__.__globals__['__builtins__']['open']('"
                             + marker + "', 'w') }}",
        "subclasses-walk": "{% for c in ''.__class__.__mro__[1].__subclasses__() %}"
                           "{% if c.__name__ == 'Popen' %}{{ c(['touch', '" + marker + "']) }}{% endif %}{% endfor %}",
        "format-attribute": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
        "huge-range": "{% for i in range(10**9) %}x{% endfor %}",
        "infinite-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "gigabyte-output": "{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}",
        "gigabyte-string": "{{ 'x' * 1000000000 }}",
    }


def _available_runners() -> list:
    names = ["hf", "minijinja", "hfjs"]
    if importlib.util.find_spec("runners.evaluator.runner") is not None:
        names.append("evaluator")
    return names


def _request(template: str, template_id: str) -> RenderRequest:
    return RenderRequest.make(template=template, messages=MESSAGES, template_id=template_id, case_id="hostile")


@pytest.mark.parametrize("runner_name", _available_runners())
def test_hostile_templates_are_bounded_and_the_run_continues(runner_name, tmp_path):
    marker = tmp_path / "escaped"
    templates = hostile_templates(str(marker))
    requests = []
    for name, template in templates.items():
        requests += [_request(template, name), _request(NORMAL, f"after-{name}")]
    runner = get_runner(runner_name, timeout=TIME_LIMIT)
    started = time.monotonic()
    try:
        outcomes = list(runner.render_many(requests))
    finally:
        runner.close()
    elapsed = time.monotonic() - started
    assert len(outcomes) == len(requests)
    report = []
    for request, outcome in zip(requests, outcomes):
        if request.template_id.startswith("after-"):
            assert outcome == Rendered("[user]hello"), f"{runner_name}: the cell after {request.template_id[6:]} " \
                                                       f"did not render: {outcome!r}"
            continue
        report.append(f"{request.template_id}: {type(outcome).__name__}")
        if isinstance(outcome, (Raised, Errored)):
            continue
        assert isinstance(outcome, Rendered), outcome
        # Rendering is acceptable only when nothing leaked and the output stayed small.
        assert len(outcome.text) <= MAX_HARMLESS_OUTPUT, f"{request.template_id}: {len(outcome.text)} chars"
        for leak in ("<module", "<built-in", "<class", "<function", "__builtins__", "Popen"):
            assert leak not in outcome.text, f"{runner_name} {request.template_id} leaked: {outcome.text[:300]!r}"
    assert not marker.exists(), f"{runner_name}: a template escaped the sandbox and created {marker}"
    # Every hostile cell is bounded by the runner's per-cell limit (plus a restart each).
    assert elapsed < len(templates) * (TIME_LIMIT + 30)
    print(f"\n{runner_name}: " + "; ".join(report) + f" ({elapsed:.1f} s)")
