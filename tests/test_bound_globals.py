"""A global the engine binds where the request gives none (causes._owned_by_what_is_bound): the template reading
another name instead leaves no difference, so the binding owns it, whatever the template prints through it; a
template-engine bug on the bound value is not the binding's. Against the real reference and the HF-faithful
harness binding `date_string` (and one template-engine bug) on purpose."""
from __future__ import annotations

from conformance.explain import cluster
from conformance.explain.causes import find_owners
from conformance.explain.reduce import Found
from runners.base import Conversation, RenderRequest
from planted_support import differing

PLANTED = ("date-string-bound", "trim-keeps-newlines")
USER = [{"role": "user", "content": "hi"}]


def _request(template: str, bos=None, eos=None) -> RenderRequest:
    return RenderRequest(template, Conversation(messages=USER), bos, eos, "t", "c")


def test_renaming_touches_only_the_bare_name_inside_tags():
    template = ("date_string {{ date_string }}{{ m.date_string }}{{ f(date_string=1) }}{{ 'date_string' }}"
                "{% set date_string = date_string ~ 'x' %}{% if date_string == 'y' %}{% endif %}")
    assert cluster.renamed(template, ["date_string"]) == (
        "date_string {{ _chatgold_unbound0 }}{{ m.date_string }}{{ f(date_string=1) }}{{ 'date_string' }}"
        "{% set _chatgold_unbound0 = _chatgold_unbound0 ~ 'x' %}{% if _chatgold_unbound0 == 'y' %}{% endif %}")


def test_a_token_the_request_gives_is_no_bound_name():
    template = "{{ bos_token }}{{ eos_token }}{{ enable_thinking }}{{ messages[0].content }}"
    case = Conversation(messages=USER).to_dict()
    assert cluster.bound_names(template, case, "<s>", None) == ["enable_thinking", "eos_token"]
    assert cluster.bound_names(template, dict(case, kwargs={"enable_thinking": True}), "<s>", "</s>") == []


def test_a_bound_global_owns_its_difference_whatever_the_template_prints(planted):
    reference, engine = planted
    requests = {
        "prints": _request("{{ date_string }}"),
        # the reproducer's literal is whitespace: still the binding's (a whitespace difference used to be
        # keyed as the template's text)
        "tests-space": _request("{% if date_string is defined %}{{ ' ' }}{% endif %}"),
        "tests-text": _request("{% if date_string is defined %}<{% endif %}"),
        "default": _request("{{ date_string | default('today') | upper }}"),
        # the template's own default for the name: renamed with it, so it still reads as the reference does
        "own-default": _request("{% if not date_string is defined %}{% set date_string = 'x' %}{% endif %}"
                                "{{ date_string }}"),
        # a trim bug on data: nothing the template reads is unbound, nothing is owned by a binding
        "trim": _request("{{ (messages[0].content ~ '\\n') | trim }}"),
    }
    found = {name: Found(request, ref, eng, symptom, 0, True)
             for name, request, ref, eng, symptom, _ in differing(planted, requests)}
    find_owners(found, reference, engine)
    owners = {name: repro.owner for name, repro in found.items()}
    for name in ("prints", "tests-space", "tests-text", "default", "own-default"):
        assert owners[name] == ("binds:date_string",), name
    assert not any(trigger.startswith("binds:") for trigger in owners["trim"])
    keys = {cluster.cause_key(repro.symptom, cluster.constructs_of(repro.template), repro.reference, repro.engine,
                              owner=repro.owner) for name, repro in found.items() if name != "trim"}
    assert keys == {"binds:date_string#diverges|binds"}
    assert cluster.title(found["tests-space"].symptom, [], found["tests-space"].reference,
                         found["tests-space"].engine, owner=owners["tests-space"]).startswith(
        "`date_string` (a global the conversation does not set): ")

