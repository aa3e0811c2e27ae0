"""MiniJinja's harness shares a kept conversation between the cells that refer to it (it only reads requests);
every product built on it keeps getting fresh data, and sharing never changes an outcome."""
from __future__ import annotations

import itertools

import pytest

from conformance.corpus.cases import load_cases
from conformance.corpus.manifest import load_corpus
from conformance.judge.pipeline import iter_cells
from runners.base import Errored, RenderRequest
from runners.minijinja_runner import MiniJinjaRenderer, MiniJinjaRunner, reads_requests_only
from runners.protocol import requests_from_batch


def test_only_minijinjas_own_request_path_shares_requests():
    from runners.mistralrs_runner import MistralRsRenderer
    from runners.mistralrs_server import MistralRsServerRenderer
    from runners.sglang_runner import SGLangRenderer
    from runners.tgi_runner import TGIRenderer

    assert reads_requests_only(MiniJinjaRenderer())
    for product in (TGIRenderer, MistralRsRenderer, MistralRsServerRenderer, SGLangRenderer):
        assert not reads_requests_only(product()), product.__name__

    class Rewriting(MiniJinjaRenderer):
        def finish(self, text, request):
            return text

    assert not reads_requests_only(Rewriting())


def test_shared_refs_are_the_kept_conversation_and_a_missing_ref_still_errors():
    conversation = RenderRequest.make("T", [{"role": "user", "content": "hi"}]).conversation
    message = {"cmd": "batch", "seq": 1, "template": "T", "bos_token": None, "eos_token": None,
               "cases": [{"ref": 5}, {"keep": 0, **conversation.to_dict()}]}
    kept: dict = {}
    cells = requests_from_batch(message, kept, fresh=False)
    assert isinstance(cells[0], Errored) and "no conversation kept as 5" in cells[0].message
    again = requests_from_batch({**message, "cases": [{"ref": 0}, {"ref": 0}]}, kept, fresh=False)
    assert again[0].conversation is again[1].conversation is cells[1].conversation
    assert cells[1].conversation == conversation


@pytest.fixture(scope="module")
def corpus_cells():
    corpus = load_corpus()
    # Templates that refuse, render, and loop over tools and messages, with every case: each conversation is
    # sent in full once and by reference for every later template.
    return list(iter_cells(corpus.entries[:12], load_cases()))


def test_the_harness_sharing_conversations_answers_as_the_engine_in_process(corpus_cells):
    requests = [cell.request for cell in corpus_cells]
    engine = MiniJinjaRenderer()
    expected = [engine.render(request) for request in requests]
    with MiniJinjaRunner(workers=1) as runner:
        # Twice through one process: the second pass is all references to conversations kept in the first.
        answered = list(itertools.chain(runner.render_many(requests), runner.render_many(requests[::-1])))
    assert answered[:len(requests)] == expected
    assert answered[len(requests):] == expected[::-1]
