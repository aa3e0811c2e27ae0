"""Reproducers rendered on the `planted` fixture's pair (tests/conftest.py): the reference and the HF-faithful
harness with bugs planted."""
from __future__ import annotations

from conformance.explain import cluster
from conformance.explain.driver import render_pairs
from conformance.explain.signature import compare


def differing(planted, requests: dict):
    """(name, request, reference outcome, engine outcome, symptom, constructs) for each of `requests` (name ->
    RenderRequest) rendered on both sides; each must differ."""
    reference, engine = planted
    pairs = render_pairs(reference, engine, list(requests.values()))
    for (name, request), (ref, eng) in zip(requests.items(), pairs):
        symptom = compare(ref, eng)
        assert symptom is not None and symptom.differs, (name, ref, eng)
        yield name, request, ref, eng, symptom, cluster.constructs_of(request.template)
