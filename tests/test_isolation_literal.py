"""Culprit isolation (conformance/explain/isolate.py) for an engine whose request layer passes the template
none of the caller's variables, as TGI's and mistral.rs's chat routes do: the site alone cannot be given its
value as the request's data there, so it is written into the template as a literal. Before, such an engine
had no culprit isolated, and one `.get()` refusal reached directly, through `|default` or through a macro was
four causes of mistral.rs and three of TGI. A value that reaches the site undefined is captured as a mark and
written as an unbound name (TGI's `content|default('', true)`, refused, was two causes)."""
from __future__ import annotations

import json

from conformance.explain import cluster, isolate
from conformance.explain.driver import render_pairs
from conformance.explain.signature import compare
from runners.base import Conversation, RenderRequest

PLANTED = ("get-default-ignored", "trim-keeps-newlines", "no-caller-variables")


def test_an_engine_binding_no_caller_variables_still_has_its_culprit_isolated(planted):
    reference, engine = planted
    cases = {
        # `|trim` only carries what the buggy `.get(k, d)` returned
        "get-then-trim": ("{{ messages[0].get('name', '<x>')|trim }}", [{"role": "user", "content": "hi"}],
                          ["method:get"]),
        # a value reaching the site that is undefined (a name the template never bound): written as an unbound
        # name, which only the literal route can carry
        "get-undefined-default": ("{{ messages[0].get('name', missing)|trim }}", [{"role": "user", "content": "hi"}],
                                  ["method:get"]),
        # the macro only carries the content to the buggy `|trim`
        "trim-in-macro": ("{% macro m(v) %}{{ v|trim }}{% endmacro %}{{ m(messages[0].content) }}",
                          [{"role": "user", "content": "\n"}], ["filter:trim"]),
    }
    for name, (template, messages, culprits) in cases.items():
        request = RenderRequest(template, Conversation(messages=messages), None, None, "t", "c")
        [(ref, eng)] = render_pairs(reference, engine, [request])
        symptom = compare(ref, eng)
        assert symptom is not None and symptom.differs, (name, ref, eng)
        constructs = isolate.isolated_constructs(request, symptom, ref, eng, reference, engine)
        assert cluster.culprits(constructs) == culprits, (name, constructs)
    # the data route is closed to this engine: what made the literal route needed
    given = Conversation(messages=[{"role": "user", "content": "H"}], kwargs={"x": [1, 2]})
    [(ref, eng)] = render_pairs(reference, engine, [RenderRequest(isolate.CONTROL, given, None, None, "t", "c")])
    assert ref.text == ".." and eng.text != ".."


def test_a_literal_reads_back_as_the_value(planted):
    reference, _ = planted
    value = [{"b": [1, 2.5, None], "a": "it's \"q\" \\ \n é"}, True, False, None, -3, "", {}]
    request = RenderRequest("{% set x = " + isolate.literal(value) + " %}{{ x|tojson }}",
                            Conversation(messages=[{"role": "user", "content": "H"}]), None, None, "t", "c")
    [outcome] = reference.render_many([request])
    assert json.loads(outcome.text) == value
