"""The run's memo of rendered pairs (explain/driver.PairMemo): a candidate that another reduction of the run
rendered already is answered from it, byte for byte what rendering it again gives; a pair with a runner error
is never kept. Real runners: the reference and MiniJinja."""
from __future__ import annotations

import pytest

from conformance.explain.driver import DriverStats, PairMemo, render_pairs
from runners import get_runner
from runners.base import Conversation, Errored, Rendered, RenderRequest

TEMPLATES = ["{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
             "{{ messages | tojson }}",
             "{{ bos_token }}{{ messages[0]['content'] | upper }}"]


def _request(template: str, content: str) -> RenderRequest:
    return RenderRequest(template, Conversation(messages=[{"role": "user", "content": content}]), "<s>", "</s>", "t", "c")


@pytest.fixture(scope="module")
def runners():
    reference, engine = get_runner("hf"), get_runner("minijinja")
    yield reference, engine
    reference.close()
    engine.close()


def test_memo_renders_each_candidate_once_and_answers_as_rendering_does(runners):
    reference, engine = runners
    requests = [_request(t, c) for t in TEMPLATES for c in ("hi", "a\u00e9b")]
    plain = render_pairs(reference, engine, requests)
    memo, stats = PairMemo(), DriverStats()
    # the same candidates twice in one batch: rendered once
    first = render_pairs(reference, engine, requests + requests, stats, memo)
    assert stats.renders == len(requests) and stats.memo_hits == len(requests)
    assert first == plain + plain
    # a second reduction asking for them again: nothing rendered
    again = render_pairs(reference, engine, list(reversed(requests)), stats, memo)
    assert stats.renders == len(requests) and stats.memo_hits == 2 * len(requests)
    assert again == list(reversed(plain))
    # one input differing only in the eos token is another candidate
    other = RenderRequest(TEMPLATES[2], requests[4].conversation, "<s>", "<eos>", "t", "c")
    render_pairs(reference, engine, [other], stats, memo)
    assert stats.renders == len(requests) + 1


def test_memo_keeps_key_order_apart():
    # `tojson` and `items()` print keys in order: two conversations that differ only in key order differ
    a = Conversation.from_dict({"messages": [{"role": "user", "content": "x"}], "kwargs": {"a": 1, "b": 2}})
    b = Conversation.from_dict({"messages": [{"role": "user", "content": "x"}], "kwargs": {"b": 2, "a": 1}})
    key = PairMemo.key
    assert key(RenderRequest("t", a, None, None, "t", "c")) != key(RenderRequest("t", b, None, None, "t", "c"))


def test_memo_never_keeps_a_runner_error_and_stays_bounded():
    memo = PairMemo(max_entries=2)
    memo.put(("e",), (Rendered("x"), Errored("the harness died")))
    assert memo.get(("e",)) is None
    for name in "abc":
        memo.put((name,), (Rendered(name), Rendered(name)))
    assert len(memo) == 2 and memo.get(("a",)) is None and memo.get(("c",)) == (Rendered("c"), Rendered("c"))
