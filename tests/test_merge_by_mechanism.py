"""Causes merged by mechanism (conformance/explain/causes.py, _merge_by_mechanism), rendered through the
reference and an HF-faithful jinja2 harness with two bugs planted (tests/harnesses/buggy_jinja2.py):

- bos-doubled: `{{ bos_token }}` prints the token twice, whatever the data;
- null-keys-kept: a message key whose value is null reaches the template as none (the reference drops it).

A cause whose template differs whatever the data must never take another cause's cells because the two
reproducers' data share an incidental feature (here add_generation_prompt, as TGI binds it always): that put
14,111 tool cells of the tgi baseline under a compile-error cause. Two reproducers of one bug still merge.
"""
from __future__ import annotations


import pytest

from conformance.explain import cluster
from conformance.explain.causes import Cause, _merge_by_mechanism
from conformance.explain.driver import DriverStats
from conformance.explain.reduce import Found
from planted_support import differing
from runners.base import Conversation, RenderRequest

PLANTED = ("bos-doubled", "null-keys-kept")


def _causes(planted, reproducers: dict) -> dict:
    """name -> a Cause built from its reproducer (template, messages, bos_token) rendered on both sides."""
    requests = {name: RenderRequest(template, Conversation(messages=messages, add_generation_prompt=True), bos,
                                    None, f"t-{name}", "c")
                for name, (template, messages, bos) in reproducers.items()}
    out = {}
    for name, request, ref, eng, symptom, constructs in differing(planted, requests):
        key = cluster.cause_key(symptom, constructs, ref, eng)
        out[name] = Cause(id=cluster.cause_id(key), key=key, title=cluster.title(symptom, constructs, ref, eng),
                          constructs=cluster.culprits(constructs), all_constructs=constructs, symptom=symptom,
                          found=Found(request, ref, eng, symptom, 1, True), cells=[(f"t-{name}", "c")],
                          candidates=[(f"t-{name}", name)])
    return out


def test_a_cause_takes_another_only_when_it_is_that_mechanism(planted):
    reference, engine = planted
    null_name = [{"role": "user", "content": "hi", "name": None}]
    causes = _causes(planted, {
        "bos": ("{{ bos_token }}", [{"role": "user", "content": "hi"}], "<s>"),
        "name": ("{{ messages[0].name }}", null_name, None),
        "name-loop": ("{% for c in messages[0].name %}{{ c }}{% endfor %}", null_name, None),
        "name-test": ("{% if messages[0].name is none %}X{% endif %}", null_name, None),
    })
    # Four causes to begin with, all with the generation prompt on; three print something extra.
    assert len({cause.id for cause in causes.values()}) == 4
    assert [cluster.difference_class(c.found.reference.text, c.found.engine.text) for c in causes.values()
            if c.found.engine.kind == "rendered"] == ["adds"] * 3
    merged = _merge_by_mechanism(list(causes.values()), {}, reference, engine, DriverStats())
    cells = sorted(sorted(cause.cells) for cause in merged)
    assert cells == [[("t-bos", "c")], [("t-name", "c"), ("t-name-loop", "c"), ("t-name-test", "c")]]
    # The doubled token keeps its own cell only: its template doubles the token given any data, so showing it
    # with the others' data proves nothing about their cells (the old code filed every cell under it). The null
    # key kept, printed, iterated or tested, is one bug through three templates, checked by rendering.
