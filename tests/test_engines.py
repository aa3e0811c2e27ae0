"""MiniJinja, @huggingface/jinja and the example harnesses against the HF reference, through the protocol.

Easy templates must match HF byte for byte; the known divergences must show up as they really are.
"""
from __future__ import annotations

import pytest

from runners import get_runner
from runners.base import Raised, Rendered, RenderRequest, Skipped
from runners.command import CommandRunner
from runners.examples import example_argv

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9\u4e16 \U0001F600"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Again?"},
]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
EASY = {
    "chatml": (CHATML, {}),
    "bos-eos-loop": ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
                     "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% endif %}\n{% endfor %}", {}),
    "namespace-and-loop": ("{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}"
                           "{{ loop.index0 }}:{{ m['role'][:1] | upper }}{% if not loop.last %},{% endif %}"
                           "{%- endfor -%}|{{ ns.n }}", {}),
    "kwargs-and-clock": ("{% if enable_thinking is defined and not enable_thinking %}nothink {% endif %}"
                         "{{ strftime_now('%d %b %Y') }}", {"kwargs": {"enable_thinking": False},
                                                            "now": "2024-07-04T12:34:56+00:00"}),
    "lstrip-trim-blocks": ("<s>\n  {% for m in messages %}\n    {{ m.content }}\n  {% endfor %}\n</s>", {}),
}


def request(template, messages=CONVERSATION, **options):
    options.setdefault("bos_token", "<s>")
    options.setdefault("eos_token", "</s>")
    return RenderRequest.make(template, messages, **options)


@pytest.fixture(scope="module")
def hf():
    with get_runner("hf") as runner:
        yield runner


@pytest.fixture(scope="module")
def minijinja():
    with get_runner("minijinja", validate=True) as runner:
        yield runner


@pytest.fixture(scope="module")
def hfjs():
    with get_runner("hfjs", validate=True) as runner:
        yield runner


@pytest.fixture(scope="module")
def engines(minijinja, hfjs):
    return {"minijinja": minijinja, "hfjs": hfjs}


@pytest.mark.parametrize("engine", ["minijinja", "hfjs"])
@pytest.mark.parametrize("case", sorted(EASY))
def test_easy_templates_match_hf(engines, hf, engine, case):
    template, options = EASY[case]
    req = request(template, add_generation_prompt=True, **options)
    expected = hf.render(req)
    assert isinstance(expected, Rendered), expected
    assert engines[engine].render(req) == expected


@pytest.mark.parametrize("engine", ["minijinja", "hfjs"])
def test_raise_exception_is_raised_with_the_message(engines, hf, engine):
    req = request("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}")
    assert isinstance(hf.render(req), Raised)
    outcome = engines[engine].render(req)
    assert isinstance(outcome, Raised) and "Conversation roles must alternate" in outcome.message


def test_engines_describe_themselves(minijinja, hfjs):
    assert minijinja.start()["name"] == "minijinja" and minijinja.version == "3.1.0"
    described = hfjs.start()
    assert {k: described[k] for k in ("name", "version", "language", "homepage")} == {
        "name": "hfjs", "version": "0.5.11", "language": "javascript", "homepage": hfjs.homepage}
    assert described["protocol"] == 2 and described["build"].startswith("@huggingface/jinja@0.5.11")


# ---- divergences measured on this machine: they must stay visible ----

def test_minijinja_rejects_tojson_ensure_ascii(hf, minijinja):
    req = request("{{ tools | tojson(ensure_ascii=False) }}", tools=[{"name": "caf\u00e9"}])
    assert hf.render(req) == Rendered('[{"name": "caf\u00e9"}]')
    outcome = minijinja.render(req)
    assert isinstance(outcome, Raised) and "ensure_ascii" in outcome.message


def test_minijinja_has_no_generation_block(hf, minijinja):
    req = request("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    assert isinstance(hf.render(req), Rendered)
    outcome = minijinja.render(req)
    assert isinstance(outcome, Raised) and "unknown statement generation" in outcome.message


def test_minijinja_iterates_none_where_jinja2_raises(hf, minijinja):
    req = request("{% for t in tools %}{{ t }}{% endfor %}ok")
    assert isinstance(hf.render(req), Raised) and "not iterable" in hf.render(req).message
    assert minijinja.render(req) == Rendered("ok")


def test_minijinja_data_is_native_not_python_objects(hf, minijinja):
    # A Rust embedder's data has no Python methods such as dict.pop; HF's jinja2 sandbox refuses it too,
    # but differently, so the messages differ while both refuse.
    req = request("{{ messages[0].pop('content') }}")
    outcome = minijinja.render(req)
    assert isinstance(outcome, Raised) and "has no method named pop" in outcome.message


def test_hfjs_lacks_str_format(hf, hfjs):
    req = request("{{ '{} and {}'.format(1, 2) }}")
    assert hf.render(req) == Rendered("1 and 2")
    outcome = hfjs.render(req)
    assert isinstance(outcome, Raised) and "not a function" in outcome.message


def test_hfjs_prints_dicts_as_json(hf, hfjs):
    req = request("{{ messages[0] }}|{{ true }}")
    assert hf.render(req) == Rendered("{'role': 'system', 'content': 'Be brief.'}|True")
    assert hfjs.render(req) == Rendered('{"role": "system", "content": "Be brief."}|true')


def test_undefined_special_tokens_are_undefined(hf, minijinja, hfjs):
    req = request("[{{ bos_token }}]{% if bos_token is defined %}defined{% endif %}", bos_token=None)
    assert hf.render(req) == Rendered("[]")
    assert minijinja.render(req) == Rendered("[]")
    assert hfjs.render(req) == Rendered("[]")


def test_continue_final_message_is_skipped_not_faked(minijinja, hfjs):
    req = request(CHATML, continue_final_message=True)
    assert isinstance(minijinja.render(req), Skipped)
    assert isinstance(hfjs.render(req), Skipped)


# ---- example harnesses, through the command runner ----

def test_example_harnesses_conform_to_the_schemas():
    import io

    from runners.protocol.validate import validate_harness

    for name in ("ferrox", "paperkiln"):
        out = io.StringIO()
        assert validate_harness(example_argv(name), out=out), out.getvalue()
    # chatml-builtin speaks the protocol flawlessly but never reads the template: validation says so.
    out = io.StringIO()
    result = validate_harness(example_argv("chatml-builtin"), out=out)
    assert not result and result.protocol == 2
    assert "FAIL template-sensitivity" in out.getvalue() and "schema violation" not in out.getvalue()


def test_chatml_builtin_matches_with_a_generation_prompt_and_ignores_the_template(hf):
    with get_runner("chatml-builtin", validate=True) as builtin:
        req = request(CHATML, add_generation_prompt=True)
        assert builtin.render(req) == hf.render(req)
        # It always appends the assistant header, and it never reads the template.
        without = request(CHATML, add_generation_prompt=False)
        assert hf.render(without) != builtin.render(without) == hf.render(req)
        assert builtin.render(request("{{ 'anything' }}", add_generation_prompt=True)) == hf.render(req)
    # The same harness through the generic command: spec.
    import shlex

    with get_runner("command:" + shlex.join(example_argv("chatml-builtin"))) as generic:
        assert generic.render(req) == hf.render(req)
        assert generic.name == "chatml-builtin"


def test_ferrox_matches_on_whitespace_controlled_templates_and_diverges_where_it_says(hf):
    with get_runner("ferrox", validate=True) as ferrox:
        controlled = request("{%- for m in messages -%}\n  {{- m['role'] -}}\n{%- endfor -%}")
        assert ferrox.render(controlled) == hf.render(controlled) == Rendered("systemuserassistantuser")
        # No trim_blocks/lstrip_blocks: the newline after a block tag stays.
        blocks = request(EASY["lstrip-trim-blocks"][0])
        assert ferrox.render(blocks) != hf.render(blocks)
        # Its tojson sorts keys (HF keeps order); only get/split/strip/lstrip/rstrip exist as methods.
        tools = request("{{ tools[0] | tojson }}", tools=[{"name": "f", "description": "d"}])
        assert hf.render(tools) == Rendered('{"name": "f", "description": "d"}')
        assert ferrox.render(tools) == Rendered('{"description": "d", "name": "f"}')
        # serde keeps a float a float (the binding alone would hand the filter 100.0 as 100)
        assert ferrox.render(request("{{ {'b': 100.0, 'a': 2.5e-05}|tojson }}")) == Rendered('{"a": 2.5e-5, "b": 100.0}')
        items = ferrox.render(request("{% for k, v in messages[0].items() %}{{ k }}{% endfor %}"))
        assert isinstance(items, Raised) and "no method named items" in items.message
        clock = ferrox.render(request("{{ strftime_now('%A %F %T %j %-d') }}", now="2024-07-04T12:34:56+00:00"))
        assert clock == Rendered("Thursday 2024-07-04 12:34:56 186 4")
        # tools=[] is bound as null, so `tools is not none` differs from HF.
        empty = request("{% if tools is not none %}TOOLS{% endif %}", tools=[])
        assert hf.render(empty) == Rendered("TOOLS") and ferrox.render(empty) == Rendered("")


QWEN_LIKE = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
             "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}" + CHATML)


def test_paperkiln_renders_its_record_and_skips_what_it_cannot_resolve(hf):
    argv = example_argv("paperkiln")
    with CommandRunner(argv + ["--declared", "chatml-qwen2.5/1"], validate=True) as declared:
        for messages in (CONVERSATION, CONVERSATION[1:]):
            req = request(QWEN_LIKE, messages=messages, add_generation_prompt=True)
            assert declared.render(req) == hf.render(req)
        # Its structure rules refuse what a Jinja template would render.
        odd = request(QWEN_LIKE, messages=[{"role": "assistant", "content": "x"}], add_generation_prompt=True)
        assert isinstance(hf.render(odd), Rendered)
        assert isinstance(declared.render(odd), Raised)
    with get_runner("paperkiln") as undeclared:
        outcome = undeclared.render(request(QWEN_LIKE, add_generation_prompt=True))
        assert isinstance(outcome, Skipped) and "raw completion only" in outcome.message
