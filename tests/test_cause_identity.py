"""A cause's identity is its mechanism, never its symptom's shape alone (conformance/explain/cluster.py,
cause_key and read_paths), checked on pairs rendered by the reference and an HF-faithful jinja2 harness with
bugs planted (tests/harnesses/buggy_jinja2.py):

- eos-token-unbound: `{{ eos_token }}` prints nothing;
- generation-prompt-ignored: `{% if add_generation_prompt %}X{% endif %}` prints nothing;
- null-keys-kept: a message key whose value is null reaches the template as none (prints `None`).

The first two are unrelated bugs with one symptom ("prints nothing") and no construct of their own: keyed by the
difference alone they shared one id (as a `bos_token` cause and MiniJinja's missing `thinking` alias did). One
bug shown with other data, or through another key of the data, keeps one id.
"""
from __future__ import annotations


import pytest

from conformance.explain import cluster
from conformance.explain.driver import render_pairs
from conformance.explain.signature import compare
from runners import get_runner
from planted_support import differing
from runners.base import Conversation, RenderRequest

PLANTED = ("eos-token-unbound", "generation-prompt-ignored", "null-keys-kept")


def _ids(planted, reproducers: dict) -> dict:
    """name -> (cause id, title) of a reproducer (template, messages, extra conversation fields) rendered."""
    requests = {}
    for name, (template, messages, extra) in reproducers.items():
        conversation = Conversation(messages=messages, add_generation_prompt=True, **extra)
        requests[name] = RenderRequest(template, conversation, "<s>", "</s>", f"t-{name}", "c")
    out = {}
    for name, request, ref, eng, symptom, constructs in differing(planted, requests):
        paths = cluster.read_paths(request.template, request.conversation.to_dict())
        key = cluster.cause_key(symptom, constructs, ref, eng, paths=paths)
        out[name] = (cluster.cause_id(key), cluster.title(symptom, constructs, ref, eng, paths=paths))
    return out


def test_unrelated_bugs_that_print_nothing_are_two_causes(planted):
    hi = [{"role": "user", "content": "hi"}]
    ids = _ids(planted, {
        "eos": ("{{ eos_token }}", hi, {}),
        "prompt": ("{% if add_generation_prompt %}X{% endif %}", hi, {}),
    })
    # both print nothing where the reference prints something, and neither uses a construct of its own
    assert ids["eos"][0] != ids["prompt"][0]
    assert ids["eos"][1] == "`eos_token`: prints nothing"
    assert ids["prompt"][1] == "`add_generation_prompt`: prints nothing"


def test_one_bug_in_other_data_is_one_cause(planted):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    ids = _ids(planted, {
        "eos": ("{{ eos_token }}", [{"role": "user", "content": "hi"}], {}),
        "eos-more-data": ("{{ eos_token }}", [{"role": "system", "content": "S"}, {"role": "user", "content": "x"},
                                              {"role": "assistant", "content": "y"}], {"tools": tools}),
        # a null key kept, whichever key holds the null and however the template reaches it
        "null-name": ("{{ messages[0].name }}", [{"role": "user", "content": "hi", "name": None}], {}),
        "null-id": ("{% for m in messages %}{{ m['tool_call_id'] }}{% endfor %}",
                    [{"role": "tool", "content": "r", "tool_call_id": None}], {}),
    })
    assert ids["eos"] == ids["eos-more-data"]
    assert ids["null-name"][0] == ids["null-id"][0]
    assert ids["null-name"][0] != ids["eos"][0]


def test_read_paths_normalise_names_literals_and_paths():
    data = {"messages": [{"role": "user", "content": None, "reasoning_content": "r"}]}
    same = {cluster.read_paths(t, data)[0] for t in (
        "{{ messages[0].content }}", "{{ messages[1]['content'] }}", "{% set m = messages[0] %}{{ m.content }}",
        "{% for message in messages %}{{ message.content }}{% endfor %}",
        "{% for message in messages %}{{ message.get('content') }}{% endfor %}",
        "{% for message in messages %}{{ message.role }}{% endfor %}")}
    assert same == {"messages[].*"}   # keys the data holds are the data's
    # a name the data lacks is what the template asks the engine for
    assert cluster.read_paths("{% for m in messages %}{% if 'thinking' in m %}{% endif %}{% endfor %}", data) == \
        ["messages[].thinking"]
    assert cluster.read_paths("{{ bos_token }}{{ 'x' ~ 1 }}", data) == ["bos_token"]


def test_read_paths_scope_loop_and_macro_names_to_their_bodies():
    """A macro argument or a loop name is local to its body: a macro taking `tools` does not hide the global
    `tools` the template reads elsewhere, and a request's own name passed to a macro is data it reads."""
    template = ("{% macro render(tools) %}{% for t in tools %}{{ t.name }}{% endfor %}{% endmacro %}"
                "{% if tools is defined %}{{ render(tools) }}{% endif %}")
    assert cluster.read_paths(template) == ["tools"]
    looped = "{% for tools in messages %}{{ tools.role }}{% endfor %}{{ tools }}"
    assert cluster.read_paths(looped) == ["messages[].role", "tools"]
    # a bare name the request does not give, passed to a function, is undefined on both sides
    assert cluster.read_paths("{{ raise_exception(nothing) }}", {"messages": []}) == []


def test_a_construct_refusing_each_argument_it_lacks_is_one_cause():
    """MiniJinja's `tojson` takes only `indent`: `ensure_ascii=`, `separators=` and `sort_keys=` are refused
    alike, whatever the data (they were two causes); with no construct of its own, the name a refusal quotes
    stays in the key."""
    engine, reference = get_runner("minijinja", workers=1), get_runner("hf", workers=1)
    try:
        tools = [{"type": "function", "function": {"name": "f", "description": "a'<b", "parameters": {}}}]
        requests = [RenderRequest(f"{{{{ tools|tojson({argument}) }}}}", Conversation(
            messages=[{"role": "user", "content": "H"}], tools=tools, add_generation_prompt=True), None, None,
            "t", "c") for argument in ("ensure_ascii=false", "separators=(',', ':')", "sort_keys=true")]
        keys = set()
        for request, (ref, eng) in zip(requests, render_pairs(reference, engine, requests)):
            symptom = compare(ref, eng)
            assert symptom is not None and str(symptom.status) == "engine-raised", (ref, eng)
            keys.add(cluster.cause_key(symptom, cluster.constructs_of(request.template), ref, eng))
        assert len(keys) == 1, keys
    finally:
        engine.close()
        reference.close()


def test_read_paths_keep_a_name_only_some_branches_bind_as_data():
    """`{% if not tools is defined %}{% set tools = none %}{% endif %}` (Llama 3.1, MiniMax-M1) leaves `tools` the
    request's: every name a template may read includes it; a name every branch binds is the template's."""
    defaulted = "{% if not tools is defined %}{% set tools = none %}{% endif %}{% if tools is not none %}t{% endif %}"
    assert cluster.read_paths(defaulted, maybe_data=True) == ["tools"]
    both = "{% if messages %}{% set y = 'a' %}{% else %}{% set y = 'b' %}{% endif %}{{ y }}"
    assert cluster.read_paths(both, maybe_data=True) == ["messages"]
    # a reproducer's data takes the branch it needs: read as bound, never as a global the engine binds
    branch = "{% if messages[0].role == 'system' %}{% set s = messages[0].content %}{% endif %}{{ s }}"
    assert cluster.read_paths(branch, {"messages": [{"role": "system", "content": ""}]}) == ["messages[].*"]


def test_a_printed_mapping_in_the_engine_s_own_quotes_is_one_cause_whatever_it_reads():
    """mistral.rs's MiniJinja prints a mapping or list with its strings in double quotes where Python's repr uses
    single ones: how the engine prints a value, one cause whichever data the template prints (it was one a
    path)."""
    reference, engine = get_runner("hf", workers=1), get_runner("mistralrs", workers=1)
    try:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {}}}}]
        requests = [RenderRequest(template, Conversation(messages=[{"role": "user", "content": "hi"}], tools=tools,
                                                                add_generation_prompt=True), None, None, "t", "c")
                    for template in ("{{ messages }}", "{{ tools[0].function }}", "{% set m = messages[0] %}{{ m }}")]
        keys = set()
        for request, (ref, eng) in zip(requests, render_pairs(reference, engine, requests)):
            symptom = compare(ref, eng)
            assert symptom is not None and symptom.differs and cluster.difference_class(ref.text, eng.text) == "quotes"
            keys.add(cluster.cause_key(symptom, cluster.constructs_of(request.template), ref, eng,
                                       paths=cluster.read_paths(request.template, request.conversation.to_dict()),
                                       case=request.conversation.to_dict()))
        assert len(keys) == 1, keys
    finally:
        reference.close()
        engine.close()
