"""The probe of what a template is given (conformance/explain/seen.py), on real engines: an HF-faithful engine is
given every case's data as the reference is, and mistral.rs's request layer (its reproduction, checked against
the wheel in test_mistralrs.py) is seen dropping message keys and flattening one-part content."""
from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.explain import seen
from conformance.judge.pipeline import Selection
from runners import get_runner


@pytest.fixture(scope="module")
def probes():
    cells = Selection.load(["qwen-qwen2.5-7b-instruct"]).cells()
    out = []
    for cell in cells:
        paths = seen.paths_of(cell.request.conversation.to_dict())
        if paths:
            out.append((cell.request.case_id, paths, replace(cell.request, template=seen.probe_template(paths))))
    with get_runner("hf", workers=2) as reference:
        answers = list(reference.render_many([request for _, _, request in out]))
    return out, answers


def _changes(name, probes) -> dict:
    out, answers = probes
    with get_runner(name) as engine:
        outcomes = list(engine.render_many([request for _, _, request in out]))
    found = {}
    for (case_id, paths, _), ref, eng in zip(out, answers, outcomes):
        if ref.kind == eng.kind == "rendered":
            found[case_id] = [trigger for trigger, _ in seen.changes(paths, ref.text, eng.text)]
    return found


def test_an_hf_faithful_engine_is_given_the_reference_s_data(probes):
    found = _changes("evaluator", probes)
    assert len(found) >= 85
    assert {case: triggers for case, triggers in found.items() if triggers} == {}


def test_mistralrs_is_seen_rebuilding_messages(probes):
    found = _changes("mistralrs", probes)
    assert "seen:messages[].*=dropped" in found["tool-call-args-string"]
    flattened = [case for case, triggers in found.items() if "seen:messages[].content=list>string" in triggers]
    assert flattened
    # and nothing where the request has only roles and string contents
    assert found["chat-single-user"] == []


def test_changes_name_the_shallowest_path_and_the_dropped_key_s_parent():
    case = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w"}}]}]}
    paths = seen.paths_of(case)
    import jinja2

    template = jinja2.Environment().from_string(seen.probe_template(paths))
    given = template.render(**case)
    rebuilt = template.render(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])
    assert seen.changes(paths, given, given) == []
    assert seen.changes(paths, given, rebuilt) == [
        ("seen:messages[].content=list>string", ("messages", 0, "content")),
        ("seen:messages[].*=dropped", ("messages", 1, "tool_calls"))]
    assert seen.without(case, [("messages", 1, "tool_calls")])["messages"][1] == {"role": "assistant", "content": ""}


def test_taking_out_list_items_leaves_the_others_in_place():
    case = {"messages": [{"role": "user", "content": str(i)} for i in range(12)]}
    kept = seen.without(case, [("messages", 9), ("messages", 10)])["messages"]
    assert [m["content"] for m in kept] == [str(i) for i in range(12) if i not in (9, 10)]


def test_a_top_level_list_is_a_path_of_its_own():
    case = {"messages": [{"role": "user", "content": "hi"}], "tools": []}
    paths = seen.paths_of(case)
    assert [p[1] for p in paths if len(p[1]) == 1] == [("messages",), ("tools",)]
    # the engine given no tools where the request has an empty list
    ref = "".join("l0;" if p[1] == ("tools",) else "x;" for p in paths)
    eng = "".join("n;" if p[1] == ("tools",) else "x;" for p in paths)
    assert seen.changes(paths, ref, eng) == [("seen:tools=list>none", ("tools",))]
    eng = "".join("u;" if p[1] == ("tools",) else "x;" for p in paths)
    assert seen.changes(paths, ref, eng) == [("seen:tools=dropped", ("tools",))]


def test_a_list_given_as_a_string_is_tried_as_its_parts_text():
    case = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert [v["messages"][0]["content"] for v in seen.joined(case, ("messages", 0, "content"))] == ["ab", "a b", "a\nb"]
    assert seen.joined({"messages": [{"content": [{"type": "image"}]}]}, ("messages", 0, "content")) == []


def test_a_mapping_given_in_another_key_order_is_probed_and_shown_to_the_reference_so():
    case = {"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"parameters": {}, "name": "f", "description": "d"}}]}
    paths = seen.ordered_paths(seen.paths_of(case))
    assert [p[1] for p in paths] == [("messages", 0), ("tools", 0), ("tools", 0, "function")]
    template = seen.order_template(paths)
    # the reference is given the request's order; an engine rebuilding the function as a struct is not
    assert seen.order_changes(paths, "ab;ab;abc;", "ab;ab;abc;") == []
    [(trigger, concrete, keys)] = seen.order_changes(paths, "ab;ab;abc;", "ab;ab;bca;")
    assert (trigger, concrete, keys) == (seen.ORDER, ("tools", 0, "function"), ["name", "description", "parameters"])
    assert list(seen.reordered(case, [(trigger, concrete, keys)])["tools"][0]["function"]) == keys
    assert "{% for k in tools[0][\"function\"] %}" in template
    # a key the engine added is no reordering of the request's
    assert seen.order_changes(paths, "ab;ab;abc;", "ab;ab;abc?;") == []


def test_a_content_the_request_does_not_have_is_probed_and_can_be_given():
    import jinja2

    case = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}
    [(expression, concrete)] = seen.absent_contents(case)
    assert concrete == ("messages", 1, "content")
    probe = jinja2.Environment().from_string(seen.added_template(expression))
    assert probe.render(**case) == "u"
    filled = seen.with_values(case, [(concrete, '[{"function":{"name":"f"}}]')])
    assert probe.render(**filled) == 's[{"function":{"name":"f"}}]'
    assert filled["messages"][1]["tool_calls"] and "content" not in case["messages"][1]
    assert seen.as_text_messages(filled, [(concrete, "")])["messages"] == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": '[{"function":{"name":"f"}}]'}]


def test_a_null_the_engine_kept_is_named_as_the_null_it_is():
    # the reference drops a null key (R4), an engine that keeps it shows it as "added": the null's trigger, as
    # find_owners names it, whether the engine renders or refuses
    case = {"messages": [{"role": "assistant", "content": None,
                          "tool_calls": [{"function": {"arguments": {"limit": None}}}]}]}
    assert seen.null_kept(case, ("messages", 0, "content")) == "messages.*=null"
    assert seen.null_kept(case, ("messages", 0, "tool_calls", 0, "function", "arguments", "limit")) == \
        "messages.*.*.*.*=null"
    assert seen.null_kept(case, ("messages", 0, "role")) is None
    assert seen.null_kept(case, ("messages", 1, "content")) is None
