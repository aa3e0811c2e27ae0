"""Hardening of the evaluator (issue #21 items 1 and 5): every value a template builds is accounted for before it
is built (filters, methods, tojson, format), every render runs out of process under a memory cap and a time
limit (the CLI's too), templates over MAX_TEMPLATE_BYTES are refused, and compiling is bounded in time.

Memory is measured as the peak RSS of the process that rendered (getrusage(RUSAGE_CHILDREN) in a wrapper
process that ran the runner or the CLI), time as wall time; both bounds are generous but far below what these
templates took before (2.9 GB and 28 s for the join bomb, 969 MB for the format bomb)."""
from __future__ import annotations

import json
import time

import pytest
from hardening_support import measured

from runners.base import MAX_TEMPLATE_BYTES, Errored, RenderRequest
from runners.evaluator import ChatTemplate, OutputLimitError
from runners.evaluator.environment import COMPILE_TIME_LIMIT
from runners.evaluator.errors import TemplateTooLarge

MESSAGES = [{"role": "user", "content": "hi"}]
PEAK_RSS_MB = 400   # the renderer's peak: a few times its ~40 MB baseline plus one 32 Mi-character value
SECONDS = 20.0      # per bomb, start-up of the harness included

# The reproductions of the issue, and their relatives: each asks for gigabytes in a few characters.
BOMBS = {
    "join-shared-items": "{{ (['x'*10000000]*300)|join|length }}",
    "join-attribute": "{{ ([{'a': 'x'*10000000}]*300)|join(attribute='a')|length }}",
    "tojson-indent": "{{ messages|tojson(indent=10**9) }}",
    "tojson-shared-items": "{{ (['x'*10000000]*300)|tojson|length }}",
    "replace": "{{ ('x'*1000000)|replace('x', 'y'*1000)|length }}",
    "replace-empty": "{{ ('x'*100000)|replace('', 'y'*100000)|length }}",
    "format-width": "{{ '{:>999999999}'.format(1)|length }}",
    "format-precision": "{{ '{:.999999999f}'.format(1.5)|length }}",
    "format-many-fields": "{{ ('{0}'*1000000).format('x'*1000)|length }}",
    "percent-width": "{{ ('%999999999d' % 1)|length }}",
    "format-filter": "{{ '%999999999s'|format('x')|length }}",
    "output-shared-items": "{{ ['x'*10000000]*300 }}",
    "string-filter": "{{ (['x'*10000000]*300)|string|length }}",
    "concat-shared-items": "{{ ((['x'*10000000]*300) ~ '')|length }}",
    "str-join-method": "{{ ''.join(['x'*10000000]*300)|length }}",
    "str-replace-method": "{{ ('x'*1000000).replace('x', 'y'*1000)|length }}",
    "expandtabs": "{{ ('\t'*1000000).expandtabs(1000)|length }}",
    "to-bytes": "{{ (1).to_bytes(10**9, 'big')|length }}",
    "indent-width": "{{ ('\n'*1000000)|indent(1000)|length }}",
    "wordwrap-wrapstring": "{{ ('a '*1000000)|wordwrap(1, wrapstring='x'*1000)|length }}",
    "batch-fill": "{{ [1]|batch(999999999, 'x')|list|length }}",
    "sum-lists": "{{ ([['x']*1000000]*300)|sum(start=[])|length }}",
    "lipsum": "{{ lipsum(99999999)|length }}",
    "macro-buffer": "{% macro m() %}{% for i in range(1000) %}{{ 'x'*10000000 }}{% endfor %}{% endmacro %}"
                    "{{ m()|length }}",
    "int-multiply": "{% set ns = namespace(n=7) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}"
                    "{% endfor %}{{ ns.n }}",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_the_evaluator_refuses_a_bomb_with_its_typed_error(name):
    started = time.monotonic()
    with pytest.raises(OutputLimitError):
        ChatTemplate(BOMBS[name]).render(MESSAGES)
    assert time.monotonic() - started < SECONDS


def test_every_bomb_renders_out_of_process_with_bounded_memory_and_time():
    found = measured(f"""
        import time
        from runners.base import RenderRequest
        from runners.evaluator.runner import EvaluatorRunner
        bombs = {json.dumps(BOMBS)}
        outcomes, slowest = {{}}, 0.0
        with EvaluatorRunner() as runner:
            for name, source in bombs.items():
                started = time.monotonic()
                outcome = runner.render(RenderRequest.make(source, [{{"role": "user", "content": "hi"}}]))
                slowest = max(slowest, time.monotonic() - started)
                outcomes[name] = [outcome.kind, outcome.message]
        result.update(outcomes=outcomes, slowest=slowest)
    """)
    for name, (kind, message) in found["outcomes"].items():
        assert kind == "errored" and "limit" in message, (name, kind, message)
    assert found["slowest"] < SECONDS, found["slowest"]
    assert found["children_peak_mb"] < PEAK_RSS_MB, found
    assert found["self_peak_mb"] < 150, "the renders ran in the caller's process"


def test_chatgold_render_with_the_evaluator_is_bounded(tmp_path):
    template = tmp_path / "bomb.jinja"
    template.write_text(BOMBS["join-shared-items"])
    found = measured(f"""
        import subprocess, sys, time
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "conformance.cli", "render", "--runner", "evaluator",
                               "--template-file", {str(template)!r}, "--case", "chat-single-user"],
                              capture_output=True, text=True)
        result.update(code=done.returncode, stderr=done.stderr, seconds=time.monotonic() - started)
    """)
    assert found["code"] == 4, found          # the runner failed (a bound), documented exit status
    assert "value-size limit" in found["stderr"] and "Traceback" not in found["stderr"], found["stderr"]
    assert found["children_peak_mb"] < PEAK_RSS_MB, found
    assert found["seconds"] < 60, found


def test_a_template_over_the_size_limit_is_refused():
    source = "{{ 'x' }}" * (MAX_TEMPLATE_BYTES // 9 + 1)
    with pytest.raises(TemplateTooLarge, match="over the limit"):
        ChatTemplate(source).render(MESSAGES)
    from runners.evaluator.runner import EvaluatorRunner

    with EvaluatorRunner() as runner:
        outcome = runner.render(RenderRequest.make(source, MESSAGES))
    assert isinstance(outcome, Errored) and "over the limit" in outcome.message


def test_compiling_a_huge_template_is_bounded_in_time():
    """Just under the size limit, the worst template for Jinja's parser (one `{% if %}` block per line): the
    compile either finishes or stops at COMPILE_TIME_LIMIT, and the next cell of that template does not pay
    again (the harness remembers a compile that ran out of time)."""
    line = "{% if x %}{{ y }}{% endif %}\n"
    source = line * (MAX_TEMPLATE_BYTES // len(line))
    from runners.evaluator.runner import EvaluatorRunner

    with EvaluatorRunner(timeout=2.0) as runner:
        started = time.monotonic()
        first = runner.render(RenderRequest.make(source, MESSAGES))
        first_seconds = time.monotonic() - started
        started = time.monotonic()
        second = runner.render(RenderRequest.make(source, MESSAGES))
        second_seconds = time.monotonic() - started
    assert first_seconds < COMPILE_TIME_LIMIT + 15, first_seconds
    if isinstance(first, Errored):
        assert first.timed_out and "compiling the template" in first.message, first
        assert isinstance(second, Errored) and second_seconds < 5, (second, second_seconds)
    else:
        assert first.kind == "rendered" and second.kind == "rendered"


def test_the_evaluator_harness_reports_deep_input_as_hf_does():
    """Input nested past Python's stack fails while the evaluator prepares it, as in HF: a RecursionError
    refusal, not a harness failure."""
    from runners.evaluator.runner import EvaluatorRunner

    content = current = []
    for _ in range(900):
        current.append([])
        current = current[0]
    with EvaluatorRunner() as runner:
        outcome = runner.render(RenderRequest.make("{{ messages[0].content }}",
                                                   [{"role": "user", "content": content}]))
    assert outcome.kind == "raised" and outcome.message.startswith("RecursionError"), outcome
