"""Rewrites a request layer decides by probing the template (causes._owned_by_request_rewrite): tried on the
reproducer's own template, both sides rendered, against the real reference and an HF-faithful harness whose
request layer probes the template as llama.cpp's capability probe does (tests/harnesses/buggy_jinja2.py). A
rewrite owns its difference whatever the template's check; a template-engine bug that prints the same bytes does
not, because the messages' shape it leaves is not the rewrite's."""
from __future__ import annotations

from conformance.explain import cluster
from conformance.explain.causes import find_owners
from conformance.explain.reduce import Found
from runners.base import Conversation, RenderRequest
from planted_support import differing

PLANTED = ("system-folded", "content-parts-probed", "iterable-false-on-strings")

SYSTEM = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def _request(template: str, messages: list) -> RenderRequest:
    return RenderRequest(template, Conversation(messages=messages), None, None, "t", "c")


def _found(planted, requests: dict) -> dict:
    reference, engine = planted
    found = {name: Found(request, ref, eng, symptom, 0, True)
             for name, request, ref, eng, symptom, _ in differing(planted, requests)}
    find_owners(found, reference, engine)
    return found


def _key(repro) -> str:
    case = repro.request.conversation.to_dict()
    return cluster.cause_key(repro.symptom, cluster.constructs_of(repro.request.template), repro.reference,
                             repro.engine, False, cluster.read_paths(repro.request.template, case), case,
                             repro.owner)


def test_a_system_message_taken_out_is_one_cause_whatever_the_template_checks(planted):
    found = _found(planted, {
        # the reference refuses the system message; the engine folded it into the user's, so nothing refuses
        "refuses": _request("{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
                            "{% for m in messages %}{{ m.content }}{% endfor %}", SYSTEM),
        # a template that prints user turns only: the folded system text shows in the user's
        "users-only": _request("{% for m in messages %}{% if m.role == 'user' %}[{{ m.content }}]{% endif %}"
                               "{% endfor %}", SYSTEM),
    })
    assert {name: repro.owner for name, repro in found.items()} == {
        "refuses": (cluster.SYSTEM_TAKEN_OUT,), "users-only": (cluster.SYSTEM_TAKEN_OUT,)}
    assert len({_key(repro) for repro in found.values()}) == 1
    assert "`system` message left out or folded" in cluster.owner_subject(found["refuses"].owner)


def test_string_content_given_as_a_text_part_is_owned_and_a_look_alike_engine_bug_is_not(planted):
    found = _found(planted, {
        # iterates the content as parts: the reference walks the string's characters (no `.text`), the engine
        # was given one text part
        "parts": _request("{% for p in messages[0].content %}{{ p.text }}{% endfor %}",
                          [{"role": "user", "content": "hi"}]),
        # the same bytes through `is iterable` false on strings (a template-engine bug): the template prints the
        # string itself, and the probe decides to keep it a string, which the printed shapes show
        "not-iterable": _request("{% if messages[0].content is iterable %}{% for p in messages[0].content %}"
                                 "{{ p.text }}{% endfor %}{% else %}{{ messages[0].content }}{% endif %}",
                                 [{"role": "user", "content": "hi"}]),
    })
    assert found["parts"].owner == (cluster.CONTENT_AS_PARTS,)
    assert cluster.CONTENT_AS_PARTS not in found["not-iterable"].owner
    # named as the data probe names the same change, so an engine doing it for every template is one cause too
    assert _key(found["parts"]) == f"owned:{cluster.CONTENT_AS_PARTS}"


def test_each_rewrite_s_variants_and_control():
    case = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    variants = cluster.system_rewrites(case)
    assert variants[0]["messages"] == [{"role": "user", "content": "U"}]
    assert [v["messages"][0]["content"] for v in variants[1:]] == ["S\n\nU", "S\nU", "S U", "SU"]
    assert cluster.system_rewrites(cluster.system_as_user(case)) == []
    assert case["messages"][0]["role"] == "system", "the case itself is left as it was"
    parts = cluster.content_as_parts(case)
    assert parts[0]["messages"][1]["content"] == [{"type": "text", "text": "U"}] and len(parts) == 3
    assert cluster.contents_lengthened(case)["messages"][0]["content"] == "S" + cluster.LENGTHENED
    assert cluster.content_as_parts({"messages": [{"role": "user", "content": []}]}) == []
