"""`chatgold compat --fix`: each portable rewrite proven on a corpus template by rendering (the reference's
bytes unchanged on every case, at least one real engine renders more cases right), and the proof's rules."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import schema_validator
from conformance.analysis.rewrites import REWRITES, prove
from conformance.cli import main

ROOT = Path(__file__).resolve().parent.parent
BY_NAME = {r.name: r for r in REWRITES}


def _config(tmp_path, template_id: str) -> Path:
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get(template_id)
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": entry.source(), "bos_token": entry.bos_token,
                                "eos_token": entry.eos_token}))
    return path


def _digest(capsys, path: Path, engine: str) -> dict:
    main(["compat", str(path), "--engines", engine, "--workers", "1", "--format", "json"])
    return json.loads(capsys.readouterr().out)["templates"][0]


@pytest.mark.parametrize("rewrite, template_id, engine", [
    ("get-subscript", "moonshotai-kimi-k2.7-code", "mistralrs"),         # "too many arguments" for .get(k, d)
    ("tojson-ensure-ascii", "zai-org-glm-4-9b-0414", "minijinja"),      # unknown keyword argument 'ensure_ascii'
])
def test_each_rewrite_is_proven_on_a_corpus_template(tmp_path, capsys, rewrite, template_id, engine):
    path = _config(tmp_path, template_id)
    out = tmp_path / "fixed.jinja"
    main(["compat", str(path), "--engines", engine, "--workers", "1", "--fix", str(out), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    schema_validator("compat.schema.json").validate(data)
    applied = {entry["name"]: entry for entry in data["fix"]["applied"]}
    assert rewrite in applied and applied[rewrite]["gained"][engine] > 0
    assert any(cause.startswith(f"{engine}:") for cause in applied[rewrite]["causes"])
    assert data["fix"]["after"][engine] > data["fix"]["before"][engine]
    # proven again here, independently: the written template renders the reference's bytes on every case
    text = out.read_text()
    assert text != json.loads(path.read_text())["chat_template"]
    fixed = tmp_path / "tokenizer_config.fixed.json"
    fixed.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": text}))
    again = _digest(capsys, fixed, engine)
    assert again["reference"]["digest"] == data["templates"][0]["reference"]["digest"]
    assert again["engines"][0]["counts"]["right"] == data["fix"]["after"][engine]


def test_rewrites_touch_code_only_and_nest():
    get = BY_NAME["get-subscript"].apply
    text, sites = get("Say m.get('x') here. {{ m.get('a', m.get('b', '')) }}{% if m.get('c') %}y{% endif %}")
    assert sites == 3
    assert text == ("Say m.get('x') here. {{ (m['a'] if 'a' in m else (m['b'] if 'b' in m else '')) }}"
                    "{% if (m['c'] if 'c' in m else none) %}y{% endif %}")
    ascii_ = BY_NAME["tojson-ensure-ascii"].apply
    assert ascii_("{{ x|tojson(ensure_ascii=False) }}{{ y|tojson(indent=2, ensure_ascii=False) }}") == (
        "{{ x|tojson }}{{ y|tojson(indent=2) }}", 2)
    assert ascii_("{{ x|tojson(ensure_ascii=True) }}") == ("{{ x|tojson(ensure_ascii=True) }}", 0)


def _record(digest: str, **right) -> dict:
    return {"reference": {"digest": digest}, "engines": [{"engine": e, "counts": {"right": n}} for e, n in right.items()]}


def test_the_proof_refuses_a_changed_reference_a_loss_or_no_gain():
    base = _record("a" * 64, tgi=10, minijinja=50)
    assert prove(base, _record("a" * 64, tgi=20, minijinja=50))[0]
    assert prove(base, _record("b" * 64, tgi=20, minijinja=50)) == (False, {}, "the reference's bytes change on some case")
    assert not prove(base, _record("a" * 64, tgi=20, minijinja=49))[0]
    assert not prove(base, _record("a" * 64, tgi=10, minijinja=50))[0]


def test_fix_never_overwrites_its_input(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].get('content', '') }}")
    assert main(["compat", str(path), "--engines", "tgi", "--fix", str(path)]) == 2
    assert "will not overwrite" in capsys.readouterr().err
    assert path.read_text() == "{{ messages[0].get('content', '') }}"


@pytest.mark.parametrize("rewrite, template_id, engine", [
    ("iterable-not-none", "arcee-ai-trinity-large-thinking", "minijinja"),  # `tools|length` of none
    ("digit-subscript", "zai-org-glm-5.1", "tgi"),                         # `.0.` read as a float
    ("generation-exact", "arcee-ai-trinity-nano-preview", "tgi"),          # `{%- generation %}` left in
    ("continue-as-if", "allenai-molmo2-8b", "mistralrs"),                  # no loop controls
    ("continue-flag", "fdtn-ai-foundation-sec-8b-instruct", "mistralrs"),  # no loop controls
    ("default-true", "inclusionai-ring-2.6-1t", "tgi"),                    # default(x, true): too many arguments
    ("break-flag", "saidutta69-c4ai-command-r7b-12-2024-heretic", "mistralrs"),  # Command-R7B's break
    ("string-for-index", "huggingfacetb-smolvlm-256m-instruct", "hfjs"),   # `for` refuses a string content
])
def test_each_new_rewrite_alone_is_proven_on_a_corpus_template(rewrite, template_id, engine):
    """The rewrite alone, rendered: the reference's bytes the same on every case, the engine renders more cases
    right (both by conformance/analysis/rewrites.prove over two compat records), and the rewrite names one of
    the engine's causes."""
    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get(template_id)
    text, sites = BY_NAME[rewrite].apply(entry.source())
    assert sites > 0 and text != entry.source()
    options = CompatOptions(engines=[engine], workers=1)

    def record(source: str) -> dict:
        return compat(UserTemplate(entry.id, source, entry.bos_token, entry.eos_token), options, CheckRun,
                      ExplainOptions)
    before, after = record(entry.source()), record(text)
    kept, gained, why = prove(before, after)
    assert kept, why
    assert gained[engine] > 0
    assert any(cause.startswith(f"{engine}:") for cause in BY_NAME[rewrite].causes)


def test_new_rewrites_keep_their_shapes():
    apply = {name: r.apply for name, r in BY_NAME.items()}
    assert apply["iterable-not-none"]("{% if t is iterable and t|length %}{{ 'x is iterable' }}{% endif %}"
                                      "{% if c is not iterable %}{% endif %}") == (
        "{% if (t is iterable and t is not none) and t|length %}{{ 'x is iterable' }}{% endif %}"
        "{% if (c is not iterable or c is none) %}{% endif %}", 2)
    # numbers and string literals are left alone
    assert apply["digit-subscript"]("{{ m.content.0.type }}{{ 1.5 }}{{ 'v1.0' }}") == (
        "{{ m.content[0].type }}{{ 1.5 }}{{ 'v1.0' }}", 1)
    assert apply["generation-exact"]("{%- generation -%}x{% endgeneration%}{% generation %}") == (
        "{{- '' }}{% generation %}{{ '' -}}x{% endgeneration %}{% generation %}", 2)
    assert apply["default-true"]("{{ a.b|default('', true)|trim }}{{ x|lower|default('q', true) }}") == (
        "{{ (a.b if a.b else '')|trim }}{{ x|lower|default('q', true) }}", 1)
    loop = ("{%- for m in ms %}\n{%- if m.r == 's' %}\n{%- continue %}\n{%- endif %}\n{{- m.c }}\n{%- endfor %}")
    assert apply["continue-as-if"](loop) == (
        "{%- for m in ms %}\n{%- if not (m.r == 's') %}\n{{- m.c }}\n{%- endif %}{%- endfor %}", 1)
    branch = "{% for m in ms -%}{% if a %}A{% continue %}{% else %}B{% endif %}R{% endfor %}"
    assert apply["continue-flag"](branch) == (
        "{% for m in ms -%}{% set _cg_skip = false -%}{% if a %}A{% set _cg_skip = true -%}{% else %}B{% endif %}"
        "{% if not _cg_skip %}R{% endif %}{% endfor %}", 1)
    # an endif right before the endfor: the guard opens, then closes (it once closed first and did not compile)
    assert apply["continue-flag"]("{% for m in ms %}{% if a %}{% continue %}{% endif %}{% endfor %}")[0] == (
        "{% for m in ms %}{% set _cg_skip = false %}{% if a %}{% set _cg_skip = true -%}{% endif %}"
        "{% if not _cg_skip %}{% endif %}{% endfor %}")
    # a break two ifs deep: the flag made before the loop, the body guarded, and the rest of each block after
    # the if that broke
    assert apply["break-flag"]("{%- for m in ms -%}{% if a %}{% if b %}X{%- break %} {% endif %}Y{% endif %}Z"
                               "{%- endfor %}") == (
        "{%- set _cg_break0 = namespace(on=false) %}{%- for m in ms -%}{% if not _cg_break0.on -%}{% if a %}"
        "{% if b %}X{%- set _cg_break0.on = true -%} {% endif %}{% if not _cg_break0.on %}Y{% endif %}{% endif %}"
        "{% if not _cg_break0.on %}Z{%- endif %}{%- endif %}{%- endfor %}", 1)
    # a tag quoted in a comment is not a tag (Cohere2's training template names `{% endgeneration %}` in one)
    assert apply["break-flag"]("{# {% endgeneration %} #}{% for m in ms %}{% if a %}{% break %}{% endif %}"
                               "{% endfor %}")[1] == 1
    for unplaced in ("{% for m in ms %}{% if a %}{% break %}x{% endif %}{% endfor %}",      # text after it
                     "{% for m in ms if m %}{% if a %}{% break %}{% endif %}{% endfor %}",  # a loop filter
                     "{% for m in ms %}{% if a %}{% break %}{% endif %}{% else %}{% endfor %}",
                     "{% for m in ms %}{% macro f() %}{% break %}{% endmacro %}{% endfor %}"):
        assert apply["break-flag"](unplaced) == (unplaced, 0)
    assert apply["string-for-index"]("{%- for c in m['content'] -%}{{ c }}{% endfor %}{% for t in tools %}"
                                     "{% endfor %}") == (
        "{%- for _cg_i0 in (range(m['content']|length) if m['content'] is string else m['content']) -%}"
        "{% set c = (m['content'][_cg_i0] if m['content'] is string else _cg_i0) -%}{{ c }}{% endfor %}"
        "{% for t in tools %}{% endfor %}", 1)
    # `loop.previtem` would be an index, not a character: left alone
    assert apply["string-for-index"]("{% for c in m.content %}{{ loop.previtem }}{% endfor %}")[1] == 0
    # a continue the rewrite cannot place leaves the template as it is
    assert apply["continue-flag"]("{% for m in ms %}{% if a %}{% if b %}{% continue %}{% endif %}{% endif %}"
                                  "{% endfor %}")[1] == 0


def test_the_shapes_render_as_before_in_jinja2():
    """What the proof relies on, shown on the reference's own engine: each spelling renders the same bytes."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    ms = [{"r": "s", "c": "a"}, {"r": "u", "c": "b"}, {"r": "s", "c": "c"}, {"r": "u", "c": "d"}]
    for name, template in (
            ("continue-as-if", "{%- for m in ms %}\n  {%- if m.r == 's' %}\n    {%- continue %}\n  {%- endif %}\n"
                               "  {{- m.c }}\n{%- endfor %}"),
            ("continue-flag", "{% for m in ms %}\n{% if m.r == 's' %}S{% continue %}\n{% elif m.c == 'd' %}D{% endif %}\n"
                              "[{{ m.c }}] {{ loop.index }}\n{% endfor %}"),
            ("iterable-not-none", "{% if t is iterable %}I{% else %}N{% endif %}"),
            ("default-true", "{{ t|default('x', true) }}|{{ u|default('y', true) }}")):
        text, sites = BY_NAME[name].apply(template)
        assert sites
        for values in ({"ms": ms, "t": None, "u": ""}, {"ms": ms, "t": [1], "u": "v"}):
            assert env.from_string(text).render(**values) == env.from_string(template).render(**values), name


def _loop_template(rng, control: str) -> str:
    """A random loop of nested ifs, elifs, elses, inner loops, sets and text with every whitespace control,
    `control` (break or continue) ending some blocks, with text after it up to the block's end sometimes."""
    spaces = ("", " ", "\n", "\n  ", "  \n", "\n\n ")

    def tag(body):
        return "{%" + rng.choice(("", "", "-")) + " " + body + " " + rng.choice(("", "", "-")) + "%}"

    def text():
        return rng.choice(spaces) + rng.choice(("a", "b{{ x }}", "c", "")) + rng.choice(spaces)

    def block(depth):
        out = []
        for _ in range(rng.randint(1, 3)):
            pick = rng.random()
            if pick < 0.35 and depth < 4:
                out.append(tag(f"if {rng.choice(('x % 2', 'x > 2', 'x == 1', 'y', 'not y'))}") + block(depth + 1))
                if rng.random() < 0.3:
                    out.append(tag(f"elif x == {rng.randint(0, 4)}") + block(depth + 1))
                if rng.random() < 0.3:
                    out.append(tag("else") + block(depth + 1))
                out.append(tag("endif"))
            elif pick < 0.45 and depth < 3:
                out.append(tag(f"for {rng.choice('xz')} in xs") + "[{{ loop.index }}]" + block(depth + 1)
                           + tag("endfor"))
            elif pick < 0.55:
                out.append(tag("set t = x"))
            else:
                out.append(text())
        if rng.random() < 0.4:
            out.append(tag(control) + rng.choice(spaces))
        return "".join(out)
    return text() + tag("for x in xs") + block(1) + tag("endfor") + text()


def test_the_loop_control_rewrites_render_as_before_on_random_loops():
    """break-flag and continue-flag against jinja2 with loop controls, on seeded random loops (nested ifs and
    loops, every whitespace control, trim_blocks and lstrip_blocks on and off): wherever the rewrite places the
    flag, the rewritten template renders the original's bytes."""
    import random

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    envs = [ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=lstrip, extensions=[loopcontrols])
            for trim in (True, False) for lstrip in (True, False)]
    rng = random.Random(34)
    placed = {"break": 0, "continue": 0}
    for _ in range(300):
        control = rng.choice(("break", "continue"))
        source = _loop_template(rng, control)
        text, sites = BY_NAME[f"{control}-flag"].apply(source)
        if not sites:
            continue
        placed[control] += 1
        for env in envs:
            try:
                original = env.from_string(source)
            except Exception:  # e.g. a continue outside any loop: the template itself does not compile
                break
            rewritten = env.from_string(text)
            for values in ({"xs": [0, 1, 2, 3, 4], "y": True}, {"xs": [3, 1, 2], "y": False}, {"xs": [], "y": 1}):
                assert rewritten.render(**values) == original.render(**values), (source, text, values)
    assert placed["break"] > 50 and placed["continue"] > 3  # continue-flag places only a continue one if deep


def test_string_for_index_walks_what_jinja2_walks():
    """string-for-index in jinja2: a string content walked character by character, a list of parts, a map's
    keys, an empty string, a missing content and a refused none, with the loop's index, length and else."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = ("{% for m in messages %}\n  {%- for c in m['content'] -%}\n  [{{ loop.index }}/{{ loop.length }}{{ c }}"
              "{% if c.type == 'text' %}T{{ c.text }}{% endif %}{% if loop.last %}L{% endif %}]\n"
              "  {% else %}E{% endfor %}\n{% endfor %}")
    text, sites = BY_NAME["string-for-index"].apply(source)
    assert sites == 1
    for trim in (True, False):
        for lstrip in (True, False):
            env = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=lstrip, extensions=[loopcontrols])
            for messages in ([{"content": "ab c"}], [{"content": ""}], [{}], [{"content": {"k": 1, "type": 2}}],
                             [{"content": [{"type": "text", "text": "x"}, {"type": "image"}]}]):
                assert env.from_string(text).render(messages=messages) == \
                    env.from_string(source).render(messages=messages)
            with pytest.raises(TypeError):
                env.from_string(text).render(messages=[{"content": None}])
            with pytest.raises(TypeError):
                env.from_string(source).render(messages=[{"content": None}])


def test_every_cause_a_rewrite_names_is_in_that_engines_baseline():
    """A rewrite is tied to causes that exist: each `engine:c-...` is a cause of the engine's baseline (a
    re-recorded baseline that renames one fails here until the rewrite names it again)."""
    for rewrite in REWRITES:
        for tied in rewrite.causes:
            engine, _, cause = tied.partition(":")
            assert cause.startswith("c-"), tied
            causes = json.loads((ROOT / "conformance" / "expectations" / f"{engine}.json").read_text())["causes"]
            ids = set(causes) if isinstance(causes, dict) else {c["id"] for c in causes}
            assert cause in ids, f"{rewrite.name}: {tied} is not a cause of {engine}'s baseline"


def test_rewrite_count_refuses_a_part_that_is_not_one_of_n(capsys):
    """`python -m conformance.cli.rewrite_count --part I/N` runs the I-th of N interleaved parts (run apart, they
    add up to the whole corpus); a part outside 1..N is refused by name before anything renders."""
    from conformance.cli.rewrite_count import main

    for bad in ("0/2", "3/2", "x"):
        with pytest.raises(SystemExit) as exit_info:
            main(["--part", bad, "--limit", "0"])
        assert exit_info.value.code == 2
        assert f"--part {bad!r}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["--rewrites", "break-flag,nosuch", "--limit", "0"])
    assert exit_info.value.code == 2
    assert "unknown rewrite(s) nosuch" in capsys.readouterr().err
