"""The product runners (tgi, mistralrs, llama-cpp-python): what each product does to a request, pinned.

Each expectation below comes from the product's source or from the real package (see the runners' docstrings);
the mistralrs reproduction is also checked cell by cell against the real wheel (tests/test_mistralrs.py)."""
from __future__ import annotations

import pytest

from runners import RenderRequest, get_runner
from runners.base import Raised, RefusalKind, Rendered, Skipped

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}]


def _render(runner, template, messages=USER, **fields):
    fields.setdefault("add_generation_prompt", True)
    return runner.render(RenderRequest.make(template, messages, **fields))


@pytest.fixture(scope="module")
def tgi():
    with get_runner("tgi") as runner:
        yield runner


@pytest.fixture(scope="module")
def mistralrs():
    with get_runner("mistralrs") as runner:
        yield runner


def test_tgi_environment_and_request_shape(tgi):
    # Environment::new(): no trim_blocks, so the newline after a block tag stays
    assert _render(tgi, "{% if true %}\nx{% endif %}") == Rendered("\nx")
    assert _render(tgi, "{{ raise_exception('boom') }}") == Raised("syntax error: boom", RefusalKind.RAISE)
    # content parts joined with "", image parts as markdown images; name dropped
    parts = [{"role": "user", "name": "bob", "content": [{"type": "text", "text": "a"},
                                                          {"type": "image_url", "image_url": {"url": "u"}}]}]
    assert _render(tgi, "{{ messages[0].content }}|{{ messages[0].name is defined }}", parts) == \
        Rendered("a![](u)|false")
    # add_generation_prompt is always true on the chat route: a case asking for false cannot be expressed
    assert isinstance(_render(tgi, "x", add_generation_prompt=False), Skipped)
    assert isinstance(_render(tgi, "x", kwargs={"enable_thinking": False}), Skipped)


def test_tgi_tools_get_no_tool_and_the_tool_prompt(tgi):
    out = _render(tgi, "{% for t in tools %}{{ t.function.name }}:{{ t.function.arguments }};{% endfor %}"
                       "{{ messages[-1].content }}", tools=TOOLS)
    # `arguments` (the schema, under its alias `parameters` in the request) reaches the template as JSON text;
    # no_tool as tool_grammar.rs has it at v3.3.7 (since v3.2.0 its arguments are `{"type":"object"}` only)
    assert out.text.startswith('f:{"type":"object","properties":{"x":{"type":"number"}}};no_tool:{"type":"object"};')
    assert "};hi\n---\n\nGiven the functions available" in out.text
    # a template that never reads `tools` gets them as JSON in the last message instead (struct order)
    out = _render(tgi, "{{ messages[-1].content }}", tools=TOOLS)
    assert out.text.startswith('hi\n---\n[{"type":"function","function":{"description":"d","name":"f","arguments"')
    assert '{"description":"Open ended response with no specific tool selected","name":"no_tool",' \
           '"arguments":"{\\"type\\":\\"object\\"}"}}]\n' in out.text


def test_tgi_empty_tools_list_binds_no_tool(tgi):
    # tool_choice auto chains no_tool onto any list, `[]` included: tools=[no_tool] and the tool prompt
    out = _render(tgi, "{{ tools|length }}:{{ tools[0].function.name }}|{{ messages[-1].content }}", tools=[])
    assert out.text.startswith("1:no_tool|hi\n---\n\nGiven the functions available")
    assert _render(tgi, "{{ tools is none }}|{{ messages[-1].content }}") == Rendered("true|hi")


def test_tgi_maps_print_in_key_order(tgi):
    # minijinja 2.8.0 without preserve_order: BTreeMap maps, so tojson and .items() go by key; `arguments` text
    # is serde_json's (indexmap) and keeps the request's order
    out = _render(tgi, "{% for t in tools %}{{ t|tojson }}{% endfor %}", tools=TOOLS)
    assert out.text.startswith('{"function":{"arguments":"{\\"type\\":\\"object\\",\\"properties\\"')
    assert '"description":"d","name":"f"},"type":"function"}' in out.text
    assert _render(tgi, "{% for k, v in tools[0].function.items() %}{{ k }},{% endfor %}", tools=TOOLS) == \
        Rendered("arguments,description,name,")
    assert _render(tgi, "{{ messages[0]|tojson }}") == Rendered('{"content":"hi","role":"user"}')
    # a map literal of the template is a BTreeMap too; comments and raw blocks are not rewritten
    assert _render(tgi, "{{ {'name': 'n', 'arguments': {'z': 1, 'a': 2}}|tojson }}{# {'b': 1, 'a': 2} #}"
                        "{% raw %}{'b': 1, 'a': 2}{% endraw %}") == \
        Rendered('{"arguments":{"a":2,"z":1},"name":"n"}{\'b\': 1, \'a\': 2}')


def test_tgi_engine_is_minijinja_2_8(tgi):
    # `default(value, other)` has no `lax` argument before minijinja 2.9.0: a second argument is too many
    refused = _render(tgi, "{{ 'a' }}{{ messages[0].content|default('', true) }}")
    assert isinstance(refused, Raised) and refused.message.startswith("too many arguments")
    assert _render(tgi, "{% if false %}{{ x|default('', true) }}{% endif %}{{ y|default('z') }}") == Rendered("z")
    # TGI registers no minijinja-contrib filters or functions, and has no `d` alias
    for use in ("'abc'|truncate(2)", "'<b>x</b>'|striptags", "2|pluralize", "1000|filesizeformat", "x|d('y')"):
        refused = _render(tgi, "{{ " + use + " }}")
        assert isinstance(refused, Raised) and refused.message.startswith("unknown filter: filter "), use
    for use in ("cycler(1, 2)", "joiner()"):
        refused = _render(tgi, "{{ " + use + " }}")
        assert isinstance(refused, Raised) and refused.message.startswith("unknown function: "), use
    # pycompat's unknown method carries no detail in 2.8.0
    assert _render(tgi, "{{ messages[0].foo() }}").message.startswith("unknown method (in ")


def test_tgi_tool_prompt_only_onto_content_and_nested_variables(tgi):
    calls = USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]}]
    # (no tool chunk after the calls; the rendered text is then cut after the final assistant content)
    out = _render(tgi, "{% for m in messages %}[{{ m.content }}]{% endfor %}{{ tools|length }}", calls, tools=TOOLS)
    assert out == Rendered('[hi][[{"id":"c1","type":"function","function":{"description":null,"name":"f",'
                           '"arguments":"{\\"z\\":1,\\"a\\":2}"}}]')
    # undeclared_variables(true): `tools.x` alone is not `tools`, so the tools' JSON is appended too
    out = _render(tgi, "{{ tools.x }}{{ messages[-1].content }}", tools=TOOLS)
    assert out.text.startswith('hi\n---\n[{"type":"function"')


def test_tgi_engine_source_rewrites_only_expressions():
    from runners.tgi_runner import engine_source

    # map literals with string keys are reordered in place: every line keeps its place count, a trailing comma
    # and the whitespace around items stay
    source = "{%- set c = {\n  'S2': 'b',\n  'S10': 'a',\n} -%}{{ c.items()|list }}"
    assert engine_source(source) == "{%- set c = {\n  'S10': 'a',\n  'S2': 'b',\n} -%}{{ c.items()|list }}"
    # a key that is not a plain string literal leaves the map as it is; text outside tags and strings untouched
    for kept in ("{{ {'b': 1, k: 2} }}", "x|default(1, 2) {{ '|default(1, 2)' }}", "{{ '}}' }}"):
        assert engine_source(kept) == kept
    assert engine_source("{{ f(x | default(a, true)) }}") == "{{ f(x | default(a, none, none, true)) }}"


def test_tgi_errors_name_the_template_as_template_from_str_does(tgi):
    # chat_template.rs:61-63 compiles with `template_from_str`, which names the template `<string>`
    refused = _render(tgi, "x\n{{ messages[0].content + 1 }}")
    assert refused.refusal == RefusalKind.RENDER and refused.message.endswith(" (in <string>:2)")
    assert _render(tgi, "{{ foo( }}") == Raised("syntax error: unexpected `}` (in <string>:1)", RefusalKind.COMPILE)


def test_tgi_dict_keywords_in_key_order(tgi):
    from runners.tgi_runner import engine_source

    # minijinja 2.8.0's dict() collects keyword arguments into a BTreeMap: they iterate and print by key
    assert _render(tgi, "{{ dict(b=1, a=2)|tojson }}") == Rendered('{"a":2,"b":1}')
    assert _render(tgi, "{% for k in dict(z=1, m=2, a=3) %}{{ k }}{% endfor %}") == Rendered("amz")
    # only keyword arguments move, each keeping its slot's whitespace; `==` is not a keyword
    assert engine_source("{{ dict(m,\n  b=1,\n  a=x == 2) }}") == "{{ dict(m,\n  a=x == 2,\n  b=1) }}"
    for kept in ("{{ x.dict(b=1, a=2) }}", "{{ mydict(b=1, a=2) }}", "{{ dict(b == 1, a) }}"):
        assert engine_source(kept) == kept


def test_tgi_one_scanner_for_quotes_and_brackets():
    """engine_source's tag scan and the argument/item splitter share one scanner (`_top_level`)."""
    import inspect

    from runners import tgi_runner

    assert inspect.getsource(tgi_runner).count("depth += 1") == 1
    text = "a, f('(,', [1, 2]), {'k': ')'}, b"
    assert [text[i] for i in tgi_runner._top_level(text) if text[i] == ","] == [",", ",", ","]
    assert tgi_runner._split_top(text, ",") == ["a", " f('(,', [1, 2])", " {'k': ')'}", " b"]
    # a closer with none open is outside: that is how a tag's own `}}` is found
    assert tgi_runner.engine_source("{{ {'b': '}}', 'a': [1]} }}x") == "{{ {'a': [1], 'b': '}}'} }}x"


def test_tgi_reads_requests_as_its_serde_structs_do():
    """tests/data/tgi_request_shapes.json: TGI's own request structs, compiled with serde, run on 43 bodies."""
    import json
    from pathlib import Path

    from runners.tgi_runner import rejection, text_message, tgi_tool

    data = json.loads((Path(__file__).parent / "data" / "tgi_request_shapes.json").read_text(encoding="utf-8"))
    assert len(data["cases"]) == 43
    for case in data["cases"]:
        body = case["body"]
        assert rejection(body) == case.get("refused"), case["name"]
        if "accepted" not in case:
            continue
        for message, want in zip(body["messages"], case["accepted"]["bodies"], strict=True):
            content = want.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content)
            assert text_message(message)["content"] == (want["tool_calls"] if "tool_calls" in want else content)
        tools = [tgi_tool(t) for t in body["tools"]] if body.get("tools") is not None else None
        assert tools == case["accepted"]["tools"], case["name"]


def test_tgi_refuses_a_request_before_any_template_runs(tgi):
    # the shape a reducer reaches by dropping keys: TGI answers 422 whatever the template
    refused = _render(tgi, "{{ tools }}", tools=[{}])
    assert refused == Raised("Failed to deserialize the JSON body into the target type: tools[0]: missing field "
                             "`type` at line 1 column 70", RefusalKind.RENDER)
    calls = USER + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f",
                                                                                          "arguments": {}}}]}]
    assert "untagged enum MessageBody" in _render(tgi, "x", calls).message
    # tool_call_id never reaches the template; string arguments are encoded twice
    chat = USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    out = _render(tgi, "{{ messages[1].content }}|{{ messages[2].tool_call_id is defined }}", chat)
    assert out == Rendered('[{"id":"c1","type":"function","function":{"description":null,"name":"f",'
                           '"arguments":"\\"{\\\\\\"a\\\\\\": 1}\\""}}]|false')


def test_tgi_rewrites_and_missing_features(tgi):
    assert _render(tgi, "{{ [1, 2][::-1] }}") == Rendered("[2, 1]")
    assert _render(tgi, "{% generation %}g{% endgeneration %}") == Rendered("g")
    # only the exact spelling is rewritten
    spaced = _render(tgi, "{%- generation -%}g{%- endgeneration -%}")
    assert isinstance(spaced, Raised) and spaced.refusal == RefusalKind.COMPILE
    # loop controls are on (router/Cargo.toml:51); urlencode was never asked for
    assert _render(tgi, "{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}") == \
        Rendered("1")
    assert _render(tgi, "{{ 'a b' | urlencode }}") == Raised(
        "unknown filter: filter urlencode is unknown (in <string>:1)", RefusalKind.RENDER)
    # the continue-final-message cut after the last assistant content
    chat = USER + [{"role": "assistant", "content": "sure"}]
    assert _render(tgi, "{% for m in messages %}{{ m.content }}<end>\n{% endfor %}", chat) == Rendered("hi<end>\nsure")


def test_mistralrs_environment_and_request_shape(mistralrs):
    assert _render(mistralrs, "{% if true %}\nx{% endif %}") == Rendered("x")  # trim_blocks
    assert _render(mistralrs, "{{ raise_exception('boom') }}") == Raised("invalid operation: boom", RefusalKind.RAISE)
    assert _render(mistralrs, "{{ {'b': 1.5e300, 'a': '<x>', 'c': 0.0}|tojson }}") == \
        Rendered('{"b": 1.5e+300, "a": "<x>", "c": 0.0}')
    assert _render(mistralrs, "{{ tools is defined }}|{{ enable_thinking }}|{{ date_string }}",
                   now="2031-02-03T04:05:06Z") == Rendered("false|true|03, February, 2031")
    assert _render(mistralrs, "{{ tools is defined }}", tools=[]) == Rendered("false")
    assert _render(mistralrs, "{{ [1, 2, 3][::-1] }}") == Rendered("[3, 2, 1]")
    two = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert _render(mistralrs, "{{ messages[0].content[0].text }}", two) == Rendered("a b")
    refused = _render(mistralrs, "x", [{"role": "assistant", "content": None, "tool_calls": []}])
    assert isinstance(refused, Raised) and "failed to convert" in refused.message
    assert isinstance(_render(mistralrs, "{{ 'a b'|urlencode }}"), Raised)


@pytest.fixture(scope="module")
def llama_cpp_python():
    from runners.llama_cpp_python import build

    if build.find() is None:
        pytest.fail("llama-cpp-python is not built: run scripts/setup.sh (tests never build or download)")
    with get_runner("llama-cpp-python") as runner:
        yield runner


def test_llama_cpp_python_is_the_real_formatter(llama_cpp_python):
    runner = llama_cpp_python
    assert _render(runner, "{% for m in messages %}{{ m.content|tojson }}{% endfor %}",
                   [{"role": "user", "content": "é <b>"}]) == Rendered('"é <b>"')
    assert _render(runner, "{{ bos_token }}|{{ eos_token }}|{{ tools }}", bos_token="<s>", eos_token="</s>") == \
        Rendered("<s>|</s>|None")
    raised = _render(runner, "{{ raise_exception('boom') }}", bos_token="<s>", eos_token="</s>")
    assert raised == Raised("ValueError: boom", RefusalKind.RAISE)
    broken = _render(runner, "{% for %}", bos_token="<s>", eos_token="</s>")
    assert isinstance(broken, Raised) and broken.refusal == RefusalKind.COMPILE
    assert _render(runner, "{{ strftime_now('%Y-%m-%d') }}", now="2031-02-03T04:05:06Z") == Rendered("2031-02-03")
    assert isinstance(_render(runner, "x", add_generation_prompt=False), Skipped)
    assert runner.describe()["version"] == "0.3.36"
