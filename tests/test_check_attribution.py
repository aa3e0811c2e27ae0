"""Byte attribution of divergences: the template line and construct that emitted the golden's first
differing byte, through the evaluator's render_traced (real engines, real goldens)."""
from __future__ import annotations

import pytest

from conformance.checkrun import CheckRun
from conformance.corpus.cases import load_cases
from conformance.corpus.manifest import load_corpus
from conformance.judge.attribution import attribute_divergence
from conformance.judge.goldens import Golden, read_golden
from conformance.judge.pipeline import iter_cells
from conformance.judge.status import Status
from runners import get_runner

DIVERGED = Status.DIVERGED


def check_cells(runner, cells, attribute=True):
    """The stages render -> judge -> verdict, then attribute when asked (what `chatgold check` runs)."""
    check = CheckRun(cells, attribute=attribute)
    results = check.check(runner).results
    check.attribute_results(results)
    return results

TEMPLATE = "ai21labs-ai21-jamba-reasoning-3b"  # dumps each tool with `tool | tojson`
CASE = "tools-no-parameters"                   # a description with an apostrophe: minijinja escapes it as \u0027


@pytest.fixture(scope="module")
def tojson_cell():
    corpus = load_corpus()
    template = corpus.select([TEMPLATE])
    cases = [c for c in load_cases() if c.id == CASE]
    assert template and cases, "the tojson example cell is missing from the corpus/cases"
    return list(iter_cells(template, cases))


def test_minijinja_tojson_divergence_is_attributed_to_the_tojson_line(tojson_cell):
    with get_runner("minijinja", workers=1) as runner:
        [result] = check_cells(runner, tojson_cell)
    assert result.status == DIVERGED, result
    attribution = result.attribution
    source_lines = tojson_cell[0].template.source().splitlines()
    tojson_lines = [n for n, line in enumerate(source_lines, 1) if "| tojson" in line]
    assert attribution["construct"] == "filter:tojson"
    assert attribution["line"] in tojson_lines
    assert attribution["source_line"] == source_lines[attribution["line"] - 1]
    # the golden byte at the offset is inside the JSON the filter produced (the apostrophe minijinja escapes)
    golden = read_golden(TEMPLATE, CASE)
    assert golden.data[result.divergence.offset:result.divergence.offset + 1] == b"'"


def test_attribution_refuses_when_the_traced_render_is_not_the_golden(tojson_cell):
    cell = tojson_cell[0]
    golden = read_golden(cell.template.id, cell.case.id)
    altered = Golden(golden.kind, golden.data + b"extra")
    found = attribute_divergence(cell.request, altered, len(golden.data))
    assert found == {"unavailable": "attribution unavailable: the evaluator's traced render differs from the golden"}


def test_attribution_reports_an_evaluator_failure_instead_of_guessing(tojson_cell):
    import dataclasses

    cell = tojson_cell[0]
    broken = dataclasses.replace(cell.request, template="{% for x in %}")
    found = attribute_divergence(broken, read_golden(cell.template.id, cell.case.id), 0)
    assert found["unavailable"].startswith("attribution unavailable: the evaluator's traced render failed")


def test_attribution_in_worker_processes_equals_in_process():
    import copy

    from conformance.judge import attribution

    cells = list(iter_cells(load_corpus().select(["qwen-qwen2.5-7b-instruct", "meta-llama-*3.1-8b-instruct"])[:3],
                            load_cases()))
    with get_runner("chatml-builtin", workers=2) as runner:
        results = check_cells(runner, cells, attribute=False)
    requests = {(c.template.id, c.case.id): c.request for c in cells}
    pending = [(r, requests[(r.template_id, r.case_id)], read_golden(r.template_id, r.case_id))
               for r in results if r.status == DIVERGED]
    assert len({r.template_id for r, _, _ in pending}) >= 2, "the selection should diverge on several templates"
    serial, parallel = copy.deepcopy(pending), copy.deepcopy(pending)
    attribution.attribute_results(serial, processes=1)
    attribution.attribute_results(parallel, processes=2)
    assert [r.attribution for r, _, _ in parallel] == [r.attribution for r, _, _ in serial]
    assert any("line" in r.attribution for r, _, _ in serial)
    # The workers answer what the traced render gives in this process (these templates are trusted).
    first, request, golden = serial[0]
    task = (request.template, [(request, golden, [first.divergence.offset])])
    assert attribution.attribute_template(task)[0][0] == first.attribution
