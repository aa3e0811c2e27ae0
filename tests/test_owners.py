"""Differences the request's data owns (causes.find_owners): a reproducer rendered again without its trigger, or
with the trigger as a request layer may have made it, both against the real reference and an HF-faithful
harness with request-layer bugs and one template-engine bug planted. A request-layer bug is one cause whatever
the template does with the data; a template-engine bug reached only through data is not the data's."""
from __future__ import annotations

from conformance.explain import cluster
from conformance.explain.causes import find_owners
from conformance.explain.reduce import Found
from runners.base import Conversation, RenderRequest
from planted_support import differing

PLANTED = ("developer-as-system", "continue-rebuilt", "tojson-sorts-keys", "null-keys-kept", "tool-arguments-parsed",
           "reasoning-not-aliased", "null-tools-unbound", "no-lstrip-blocks")


def _request(template: str, messages: list, **flags) -> RenderRequest:
    return RenderRequest(template, Conversation(messages=messages, **flags), None, None, "t", "c")


def _owners(planted, requests: dict) -> dict:
    reference, engine = planted
    found = {name: Found(request, ref, eng, symptom, 0, True)
             for name, request, ref, eng, symptom, _ in differing(planted, requests)}
    find_owners(found, reference, engine)
    return {name: repro.owner for name, repro in found.items()}


def test_request_layer_bugs_are_owned_by_their_data_and_template_bugs_are_not(planted):
    developer = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    owners = _owners(planted, {
        # prints the role: taking the developer message out (made a user's) leaves no difference
        "prints-role": _request("{{ messages[0].role }}", developer),
        # tests and transforms the role: only the reference given `system` prints what the engine printed
        "tests-role": _request("{% if messages[0].role is string %}{{ messages[0].role | upper }}{% endif %}",
                               developer),
        # the continuation rebuilt by the engine, through a construct of the template's own
        "continued": _request("{% for m in messages %}{{ m.role | trim }}:{{ m.content }}|{% endfor %}"
                              "{% if add_generation_prompt %}bot:{% endif %}",
                              [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
                              continue_final_message=True),
        # string arguments parsed by the engine, through a test the template makes of them
        "arguments": _request("{% set a = messages[0].tool_calls[0].function.arguments %}"
                              "{% if a is mapping %}{{ a.city }}{% else %}{{ a }}{% endif %}",
                              [{"role": "assistant", "content": "", "tool_calls": [
                                  {"type": "function", "function": {"name": "f", "arguments": '{"city": "Paris"}'}}]}]),
        # a tojson bug the template reaches only for a tool message: the template's, not the data's
        "tojson-in-branch": _request("{% if messages[0].role == 'tool' %}{{ {'b': 1, 'a': 2} | tojson }}"
                                     "{% endif %}", [{"role": "tool", "content": "r"}]),
    })
    assert owners["prints-role"] == ("role=developer",)
    assert owners["tests-role"] == ("role=developer",)
    assert owners["continued"] == ("continue_final_message",)
    assert owners["arguments"] == ("tool_calls.arguments=json",)
    assert owners["tojson-in-branch"] == ()


def test_an_owned_difference_is_keyed_and_titled_by_its_data():
    from conformance.explain.signature import Symptom
    from conformance.judge.status import Status
    from runners.base import Rendered

    symptom = Symptom(Status.DIVERGED, frozenset({("developer", "system")}), first=("developer", "system"))
    one = cluster.cause_key(symptom, ["filter:upper"], Rendered("DEVELOPER"), Rendered("SYSTEM"),
                            owner=("role=developer",))
    other = cluster.cause_key(symptom, ["test:string"], Rendered("developer"), Rendered("system"),
                              owner=("role=developer",))
    assert one == other == "owned:role=developer#output"
    assert cluster.title(symptom, ["filter:upper"], Rendered("DEVELOPER"), Rendered("SYSTEM"),
                         owner=("role=developer",)).startswith("a `developer` message")
    # the trigger taken out, and its stand-ins
    case = {"messages": [{"role": "developer", "content": None}], "continue_final_message": True}
    assert cluster.ablate(case, "continue_final_message")["continue_final_message"] is False
    assert cluster.ablate(case, "role=developer")["messages"][0]["role"] == "user"
    assert cluster.ablate(case, "messages.*=null")["messages"] == [{"role": "developer"}]
    assert [v["messages"][0]["role"] for v in cluster.stand_ins(case, "role=developer")] == \
        ["system", "user", "assistant"]
    assert cluster.stand_ins(case, "messages.*=null")[0]["messages"][0]["content"] == ""


def test_a_null_the_template_tests_is_owned_when_the_reference_answers_the_same_without_it(planted):
    """The reference drops a null key itself (R4): taking it out changes only the engine's input, so a template
    testing it (`is none`) still shows the engine's handling of nulls, not a construct's bug."""
    owners = _owners(planted, {
        "tests-null": _request("{% if not (messages[0]['content'] is none) %}t{% endif %}",
                               [{"role": "user", "content": None}]),
        "prints-null": _request("{{ messages[0]['content'] }}", [{"role": "user", "content": None}]),
    })
    assert owners == {"tests-null": ("messages.*=null",), "prints-null": ("messages.*=null",)}


def test_reasoning_under_one_name_is_one_cause_however_the_template_reads_it(planted):
    """R11: transformers gives a message's reasoning as both `thinking` and `reasoning_content`. An engine that
    passes the message as given differs through every way a template looks at `thinking` (a test, `in`, its
    truth, `is defined`): one bug, owned by the data, where a construct-keyed cause made four. A template bug
    that a reasoning message only leads to stays the template's."""
    reasoning = [{"role": "assistant", "content": "a", "reasoning_content": "r"}]
    owners = _owners(planted, {
        "is-string": _request("{% if messages[0].thinking is string %}<{% endif %}", reasoning),
        "in": _request("{% if 'thinking' in messages[0] %}{% else %}<{% endif %}", reasoning),
        "truth": _request("{% if messages[0].thinking %}<{{ messages[0].thinking }}{% endif %}", reasoning),
        "is-defined": _request("{% if messages[0].thinking is defined %}x{% endif %}", reasoning),
        "tojson-after-reasoning": _request("{% if messages[0].reasoning_content %}{{ {'b': 1, 'a': 2} | tojson }}"
                                           "{% endif %}", reasoning),
    })
    named = cluster.REASONING_NAMES
    assert owners == {"is-string": (named,), "in": (named,), "truth": (named,), "is-defined": (named,),
                      "tojson-after-reasoning": ()}
    # the trigger taken out is R11 applied, nulls left for their own trigger
    case = {"messages": [{"role": "assistant", "reasoning": "r", "content": None}]}
    assert cluster.ablate(case, named)["messages"][0] == \
        {"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r", "content": None}
    assert named not in cluster.ownable({"messages": [{"role": "user", "content": "x"}]})


def test_a_field_left_unbound_is_one_cause_however_the_template_looks_at_it(planted):
    """R7: the reference binds `tools` as none when the request has none. An engine that leaves it unbound
    differs through `is defined`, `is not none` (with or without a `{% set %}` block carrying the text) and
    printing it: bound again in the template as the reference binds it, each matches, so the missing binding
    owns them all (mistral.rs' and llama.cpp's baselines had three and four causes of it)."""
    plain = [{"role": "user", "content": "hi"}]
    owners = _owners(planted, {
        "is-defined": _request("{% if tools is defined %}x{% endif %}", plain),
        "is-not-none": _request("{% if tools is not none %}t{% endif %}", plain),
        "set-block": _request("{% set f %}Y{% endset %}{% if tools is not none %}{{ f }}{% endif %}", plain),
        "printed": _request("[{{ tools }}]", plain),
        # a template bug met where there are no tools is not the binding's
        "tojson-without-tools": _request("{% if not tools %}{{ {'b': 1, 'a': 2} | tojson }}{% endif %}", plain),
    })
    assert owners == {"is-defined": ("tools=unbound",), "is-not-none": ("tools=unbound",),
                      "set-block": ("tools=unbound",), "printed": ("tools=unbound",), "tojson-without-tools": ()}
    # the rebinding reaches none of the template's own bytes: the indent before a block tag, which the engine
    # prints (no lstrip_blocks), stays where it was (a `{%- ... -%}` prefix stripped it and owned the difference):
    # no field owns it, the missing setting does
    owners = _owners(planted, {"indented": _request("  {% if true %}x{% endif %}", plain)})
    assert owners == {"indented": ("env:lstrip_blocks",)}
    assert "documents=unbound" in cluster.ownable({"messages": [], "tools": [], "documents": None})


def test_a_block_whitespace_setting_the_engine_lacks_owns_the_difference_whichever_tag_shows_it(planted):
    user = [{"role": "user", "content": "hi"}]
    owners = _owners(planted, {
        # lstrip_blocks off (planted): the indentation before an `{% if %}` and before a `{% macro %}` is kept
        "if": _request("\n  {% if messages %}x{% endif %}", user),
        "macro": _request("\n    {% macro m() %}y{% endmacro %}{{ m() }}", user),
        # a template-engine bug, not a setting: the reference without trimming still prints otherwise
        "tojson": _request("{{ {'b': 1, 'a': 2} | tojson }}", user),
    })
    assert owners["if"] == owners["macro"] == ("env:lstrip_blocks",)
    assert owners["tojson"] == ()
    from conformance.explain.signature import Symptom
    from conformance.judge.status import Status
    from runners.base import Rendered

    symptom = Symptom(Status.DIVERGED, frozenset({("", "  ")}), first=("", "  "))
    keys = {cluster.cause_key(symptom, constructs, Rendered("x"), Rendered("  x"), owner=("env:lstrip_blocks",))
            for constructs in (["stmt:if"], ["stmt:macro", "call:macro"])}
    assert keys == {"env:lstrip_blocks#diverges|environment"}
    assert cluster.title(symptom, ["stmt:if"], Rendered("x"), Rendered("  x"), owner=("env:lstrip_blocks",)) \
        .startswith("`lstrip_blocks` off in the engine's environment")


def test_a_template_runs_as_without_trim_blocks_or_lstrip_blocks_through_plus_markers():
    import jinja2

    from conformance.explain.template import whitespace_kept

    source = "  {% if x -%}\n{# c #}\n  {% for i in [1] %}\n{{ i }}{%- endfor %}\n{% endif %}\n"
    on, off = (jinja2.Environment(trim_blocks=flag, lstrip_blocks=flag) for flag in (True, False))
    for trim, lstrip in ((True, False), (False, True), (True, True)):
        kept = jinja2.Environment(trim_blocks=not trim, lstrip_blocks=not lstrip).from_string(source).render(x=1)
        assert on.from_string(whitespace_kept(source, trim, lstrip)).render(x=1) == kept
    assert on.from_string(whitespace_kept(source, True, True)).render(x=1) == off.from_string(source).render(x=1)
