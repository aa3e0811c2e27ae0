"""A refusal of the engine's own where the reference refuses too (raised-differently): the reference's refusal
comes from the template's own check further on (`raise_exception`, a second error), a difference apart from
the engine's. Reduction goes past it (signature.Symptom.keeps): the reproducer loses what made the reference
refuse, and the cell is the same cause as the engine refusing where the reference renders. Before, the
reproducer kept the template's check and its loop, a second cause of one bug titled by incidental constructs."""
from __future__ import annotations

from conformance.explain.driver import render_pairs
from conformance.explain.finish import finish_one
from conformance.explain.signature import Symptom, compare
from conformance.judge.expectations import KnownCause
from conformance.judge.status import Status
from runners.base import Conversation, RenderRequest

PLANTED = ("no-string-test", "string-iteration-refused")

TWO = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]
CHECK = "{% if loop.index0 == 1 %}{{ raise_exception('only one message, please') }}{% endif %}"
ROUTES = {
    # compile time: the engine refuses the template whatever the data
    "no-string-test": "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}" + CHECK +
                      "{% endfor %}",
    # render time, on the first message, before the reference's check fires on the second
    "string-iteration-refused": "{% for m in messages %}{% for c in m.content %}{{ loop.index }}{% endfor %}" +
                                CHECK + "{% endfor %}",
}


def _finished(planted, template: str, messages: list):
    reference, engine = planted
    case = Conversation(messages=messages).to_dict()
    done = finish_one(KnownCause("c-0000000000", repro={"template": template, "case": case}), engine, reference)
    assert done.record is not None, done.kept_because
    return done.record


def test_an_engine_refusal_is_reduced_past_the_references_own(planted):
    reference, engine = planted
    for bug, template in ROUTES.items():
        request = RenderRequest(template, Conversation(messages=TWO), None, None, "t", "c")
        (pair,) = render_pairs(reference, engine, [request])
        assert compare(*pair).status == Status.RAISED_DIFFERENTLY, (bug, pair)
        past = _finished(planted, template, TWO)
        assert "raise_exception" not in past.repro["template"] and "index0" not in past.repro["template"], \
            (bug, past.repro["template"])
        assert past.repro["reference"]["kind"] == "rendered" and past.repro["engine"]["kind"] == "raised", bug
        # the same bug met where the reference renders: one cause
        alone = _finished(planted, template.replace(CHECK, ""), TWO[:1])
        assert past.id == alone.id, (bug, past.title, alone.title)


def test_only_the_engine_refusing_the_same_way_is_kept():
    refused = Symptom(Status.RAISED_DIFFERENTLY, refusal="TemplateAssertionError: No test named 'string'.")
    assert Symptom(Status.ENGINE_RAISED, refusal=refused.refusal).keeps(refused)
    assert not Symptom(Status.ENGINE_RAISED, refusal="TypeError: other").keeps(refused)
    # the other way round is no reduction: a refusal where the reference renders is not one where it refuses
    assert not refused.keeps(Symptom(Status.ENGINE_RAISED, refusal=refused.refusal))
    assert not Symptom(Status.ENGINE_RENDERED, refusal=refused.refusal).keeps(refused)
