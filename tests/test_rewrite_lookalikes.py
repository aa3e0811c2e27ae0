"""Look-alikes of request rewrites and of templates keyed by their text, against the real reference and the
HF-faithful harness with bugs planted (tests/harnesses/buggy_jinja2.py). A request layer that flattens a one-part
content list (TGI's, mistral.rs's) over an engine that refuses a string where Python does not gives the very
answers a layer giving string content as a text part would, as long as both sides refuse: no answer shows which
it was, so no rewrite may own it. A source rewrite of one tag's exact text runs the rest of the template: it is
not an engine ignoring the template. An engine with a format of its own for each template it recognises has one
cause per recognised text, and one that takes an empty template for none has no empty candidate template."""
from __future__ import annotations

from conformance.explain import cluster, template as tpl
from conformance.explain.causes import find_owners
from conformance.explain.driver import render_pairs
from conformance.explain.finish import finish_one
from conformance.explain.reduce import Found, keyed_by_text
from conformance.explain.signature import compare
from conformance.judge.expectations import KnownCause
from runners.base import Conversation, RenderRequest
from planted_support import differing

PLANTED = ("string-iteration-refused", "one-part-content-flattened", "generation-tags-deleted",
           "empty-template-as-chatml")

HI = [{"role": "user", "content": "hi"}]


def _request(template: str, messages: list) -> RenderRequest:
    return RenderRequest(template, Conversation(messages=messages), None, None, "t", "c")


def test_an_engine_s_own_refusal_is_not_owned_by_a_content_rewrite(planted):
    reference, engine = planted
    # the reference walks the string (a text part's `+ ''` would refuse; `loop` makes jinja2 use its loop
    # context, where the bug lives); the engine refuses the string itself, and given the parts, flattens them
    # back into that string and refuses alike
    request = _request("{% for c in messages[0].content %}{{ loop.index }}{{ c + '' }}{% endfor %}", HI)
    ((name, _, ref, eng, symptom, _),) = differing(planted, {"walk": request})
    assert eng.kind == "raised" and ref.kind == "rendered"
    parts = _request(request.template, cluster.content_as_parts(request.conversation.to_dict())[0]["messages"])
    ((ref_parts, eng_parts),) = render_pairs(reference, engine, [parts])
    assert ref_parts.kind == "raised" and eng_parts == eng, "both sides refuse the variant: the look-alike holds"
    found = {name: Found(request, ref, eng, symptom, 0, True)}
    find_owners(found, reference, engine)
    assert cluster.CONTENT_AS_PARTS not in found[name].owner


def test_a_rewrite_of_one_tag_s_text_is_not_a_template_keyed_by_its_text(planted):
    reference, engine = planted
    source = "{% generation %}{{ 'x' }}\n{% endgeneration %}"
    request = _request(source, HI)
    pair, *variant_pairs = render_pairs(reference, engine, [request] + [
        _request(variant, HI) for variant in tpl.neutral_variants(source)])
    symptom = compare(*pair)
    assert symptom.differs and pair[1].text == "x", "the deletion leaves a final newline, which is dropped"
    # a space in the first tag escapes the deletion, a prefix does not: the engine runs the template
    assert not keyed_by_text(pair, variant_pairs, symptom)
    assert keyed_by_text(pair, variant_pairs[:1], symptom), "one variant alone would call it keyed"
    record = {"template": source, "case": request.conversation.to_dict(), "bos_token": None, "eos_token": None}
    done = finish_one(KnownCause("c-0", "", "", "", [], symptom.to_dict(), record), engine, reference)
    assert done.record is not None and "ignores the template" not in done.record.title, done.record.title
    assert "generation" in done.record.title


def test_each_template_an_engine_recognises_by_its_text_is_a_cause_of_its_own():
    """An engine that puts a hand-written format in place of each template it knows (llama-cpp-python's
    chat_format guessed from the exact text) has one formatter per text: a chatml formatter's bugs and a
    mistral one's are two causes, while an engine printing one format whatever the template is one."""
    from conformance.explain.signature import diverged
    from runners.base import Rendered

    symptom = diverged("a", "b")
    keys = {name: cluster.cause_key(symptom, [], Rendered("a"), Rendered("b"), True,
                                    recognised=cluster.text_identity(text) if text else "")
            for name, text in (("chatml", "{{ 'chatml' }}"), ("mistral", "{{ 'mistral' }}"), ("any", ""))}
    assert len(set(keys.values())) == 3
    assert cluster.cause_key(symptom, [], Rendered("a"), Rendered("c"), True,
                             recognised=cluster.text_identity("{{ 'chatml' }}")) == keys["chatml"]
    assert cluster.text_identity("{{ 'chatml' }}") in cluster.title(
        symptom, [], Rendered("a"), Rendered("b"), True, recognised=cluster.text_identity("{{ 'chatml' }}"))


def test_an_empty_template_is_no_smaller_candidate_where_the_engine_takes_it_for_none(planted):
    """llama.cpp puts its ChatML in place of an empty template: a reduction ending there trades the cell's
    difference for that one (65 `developer` cells had been keyed so). `{{ '' }}` prints as little in any Jinja
    engine, so an engine answering the two otherwise takes the empty one for no template."""
    from conformance.explain.minimal import empty_means_none

    reference, engine = planted
    empty, stand_in = _request("", HI), _request(tpl.NEUTRAL_PREFIX, HI)
    on_empty, on_stand_in = render_pairs(reference, engine, [empty, stand_in])   # (reference, engine) each
    assert on_empty[1].text.startswith("<|im_start|>user") and on_stand_in[1].text == "", "the bug renders"
    assert empty_means_none(on_empty, on_stand_in)
    # the reference in the engine's place prints nothing for both: an empty template is its smallest one
    assert not empty_means_none(*[(eng, ref) for ref, eng in (on_empty, on_stand_in)])
