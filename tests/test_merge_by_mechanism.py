"""Causes merged by mechanism (conformance/explain/causes.py, _merge_by_mechanism), rendered through the
reference and an HF-faithful jinja2 harness with two bugs planted (tests/harnesses/buggy_jinja2.py):

- bos-doubled: `{{ bos_token }}` prints the token twice, whatever the data;
- null-keys-kept: a message key whose value is null reaches the template as none (the reference drops it).

A cause whose template differs whatever the data must never take another cause's cells because the two
reproducers' data share an incidental feature (here add_generation_prompt, as TGI binds it always): that put
14,111 tool cells of the tgi baseline under a compile-error cause. Two reproducers of one bug still merge.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from conformance.explain import cluster
from conformance.explain.causes import Cause, _merge_by_mechanism
from conformance.explain.driver import DriverStats, render_pairs
from conformance.explain.reduce import Found
from conformance.explain.signature import compare
from runners import get_runner
from runners.base import Conversation, RenderRequest

HARNESS = Path(__file__).parent / "harnesses" / "buggy_jinja2.py"


@pytest.fixture(scope="module")
def runners():
    argv = [sys.executable, str(HARNESS), "--bug", "bos-doubled", "--bug", "null-keys-kept"]
    engine = get_runner("command:" + shlex.join(argv), workers=1, timeout=20)
    reference = get_runner("hf", workers=1)
    yield reference, engine
    engine.close()
    reference.close()


def _causes(runners, reproducers: dict) -> dict:
    """name -> a Cause built from its reproducer (template, messages, bos_token) rendered on both sides."""
    reference, engine = runners
    requests = {name: RenderRequest(template, Conversation(messages=messages, add_generation_prompt=True), bos,
                                    None, f"t-{name}", "c")
                for name, (template, messages, bos) in reproducers.items()}
    pairs = render_pairs(reference, engine, list(requests.values()))
    out = {}
    for (name, request), (ref, eng) in zip(requests.items(), pairs):
        symptom = compare(ref, eng)
        assert symptom is not None and symptom.differs, (name, ref, eng)
        constructs = cluster.constructs_of(request.template)
        key = cluster.cause_key(symptom, constructs, ref, eng)
        out[name] = Cause(id=cluster.cause_id(key), key=key, title=cluster.title(symptom, constructs, ref, eng),
                          constructs=cluster.culprits(constructs), all_constructs=constructs, symptom=symptom,
                          found=Found(request, ref, eng, symptom, 1, True), cells=[(f"t-{name}", "c")],
                          candidates=[(f"t-{name}", name)])
    return out


def test_a_difference_that_needs_no_data_takes_no_other_cause(runners):
    reference, engine = runners
    causes = _causes(runners, {
        "bos": ("{{ bos_token }}", [{"role": "user", "content": "hi"}], "<s>"),
        "name": ("{{ messages[0].name }}", [{"role": "user", "content": "hi", "name": None}], None),
        "name-test": ("{% if messages[0].name is none %}X{% endif %}",
                      [{"role": "user", "content": "hi", "name": None}], None),
    })
    # Three causes to begin with, each printing something extra, all three with the generation prompt on.
    assert len({cause.id for cause in causes.values()}) == 3
    assert all(cluster.difference_class(c.found.reference.text, c.found.engine.text) == "adds"
               for c in causes.values())
    merged = _merge_by_mechanism(list(causes.values()), {}, reference, engine, DriverStats())
    cells = {cause.id: sorted(cause.cells) for cause in merged}
    # The doubled token keeps its own cell only: its template doubles the token given any data, so the other
    # data showing it proves nothing about the other cells (today's code filed all three under it).
    assert cells[causes["bos"].id] == [("t-bos", "c")]
    # The null key kept is one bug shown through two templates: merged, checked by rendering.
    assert sorted(cells.values()) == [[("t-bos", "c")], [("t-name", "c"), ("t-name-test", "c")]]
