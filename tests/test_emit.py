"""`chatgold explain --emit`: each emitted regression test runs in the engine's own tooling, fails on the engine
version that has the cause and passes on the version that fixed it.

The causes are real explanations (tests/data/emit/): minijinja 2.9.0's refusal of `[::-1]` (2.10.x added it)
and @huggingface/jinja 0.5.5's missing `is sequence` test (0.5.11 has it)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.report.emit import EmitError, emit, load_causes, vector_cell

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "emit"
MINIJINJA = DATA / "minijinja-2.9.0.explain.json"
HFJS = DATA / "hfjs-0.5.5.explain.json"
BASELINE = ROOT / "conformance" / "expectations" / "minijinja.json"


def _r11_cause_id() -> str:
    """The bundled MiniJinja baseline's cause for R11 (transformers aliases the reasoning fields), owned by a
    message's reasoning given under one name: found by what it is, so a re-record that renames causes keeps the
    tests meaningful."""
    from conformance.explain.cluster import REASONING_NAMES

    (cause,) = [c for c in load_causes(BASELINE).causes
                if "SEMANTICS.md R11" in c.get("reason", "") and c["repro"].get("owner") == [REASONING_NAMES]]
    return cause["id"]


def _emit_to(tmp_path, path, fmt, cause=None, **kwargs) -> dict:
    source = load_causes(path)
    chosen = source.find(cause) if cause else source.causes[0]
    files = emit(chosen, fmt, source.runner, source.reference, **kwargs)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return files


def _binding_python(version: str) -> str:
    from runners.minijinja_runner import PYPI_PACKAGE, minijinja_version
    from runners.versions import installed_venv

    if version == minijinja_version():
        return sys.executable
    python = installed_venv(f"minijinja-{version}", [f"{PYPI_PACKAGE}=={version}"])
    if python is None:
        pytest.fail(f"minijinja {version} is not installed in the cache: run scripts/setup.sh (tests never download)")
    return str(python)


def _hfjs_modules(version) -> str:
    from runners import hfjs
    from runners.versions import npm_dir

    if shutil.which("node") is None:
        pytest.fail("node is not on PATH (scripts/setup.sh)")
    modules = Path(hfjs.node_modules()) if version is None else npm_dir(hfjs.PACKAGE, version) / "node_modules"
    if not (modules / "@huggingface" / "jinja" / "package.json").is_file():
        pytest.fail(f"@huggingface/jinja {version or 'pinned'} is not installed in the cache: run scripts/setup.sh")
    return str(modules)


def _run(argv, cwd, env=None):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_minijinja_snapshot_check_fails_on_2_9_0_and_passes_on_2_10_2(tmp_path):
    files = _emit_to(tmp_path, MINIJINJA, "minijinja")
    check = next(name for name in files if name.endswith("_minijinja.py"))
    # The snapshot input is MiniJinja's own: the context as JSON, `---`, the template.
    (inputs,) = [name for name in files if name.endswith(".txt")]
    context, template = files[inputs].split("\n---\n", 1)
    assert "[::-1]" in template and json.loads(context)["eos_token"] == "<|im_end|>"
    old = _run([_binding_python("2.9.0"), check], tmp_path)
    assert old.returncode != 0 and "cannot convert number to u64" in old.stderr, old.stdout + old.stderr
    new = _run([_binding_python("2.10.2"), check], tmp_path)
    assert new.returncode == 0 and new.stdout.strip() == "ok", new.stdout + new.stderr


def test_pytest_file_fails_on_2_9_0_and_passes_on_2_10_2_and_under_pytest(tmp_path):
    files = _emit_to(tmp_path, MINIJINJA, "pytest")
    (name,) = files
    test = re.search(r"^def (test_\w+)\(", files[name], re.M).group(1)
    call = f"import runpy; runpy.run_path({name!r})[{test!r}]()"
    old = _run([_binding_python("2.9.0"), "-c", call], tmp_path)
    assert old.returncode != 0 and "cannot convert number to u64" in old.stderr, old.stderr
    assert _run([_binding_python("2.10.2"), "-c", call], tmp_path).returncode == 0
    # A real pytest file: collected and passing under pytest with this environment's binding (fixed since 2.10).
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout


def test_pytest_file_of_a_bundled_baseline_cause_fails_on_this_binding(tmp_path):
    """The baseline's cause R11 (transformers aliases reasoning fields) is still MiniJinja's today: the emitted
    test fails on this environment's binding, with the reference's bytes in the assertion."""
    cause = load_causes(BASELINE).find(_r11_cause_id())
    files = _emit_to(tmp_path, BASELINE, "pytest", cause=cause["id"])
    done = _run([sys.executable, "-m", "pytest", "-q", "-vv", "-p", "no:cacheprovider", *files], tmp_path)
    expected, engine = cause["repro"]["reference"]["text"], cause["repro"]["engine"]["text"]
    assert engine != expected
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert repr(expected) in done.stdout and repr(engine) in done.stdout, done.stdout


def test_hfjs_test_fails_on_0_5_5_and_passes_on_0_5_11(tmp_path):
    files = _emit_to(tmp_path, HFJS, "hfjs")
    (name,) = files
    old = _run(["node", name], tmp_path, {"HFJS_NODE_MODULES": _hfjs_modules("0.5.5")})
    assert old.returncode != 0 and "Unknown test: sequence" in old.stdout, old.stdout + old.stderr
    new = _run(["node", name], tmp_path, {"HFJS_NODE_MODULES": _hfjs_modules(None)})
    assert new.returncode == 0 and "# pass 1" in new.stdout, new.stdout + new.stderr


def _c_literal_values(text: str) -> list:
    """The C string literals of a line, decoded (adjacent literals joined), as the C++ compiler reads them."""
    values = []
    for group in re.findall(r'((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
        value = ""
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', group):
            value += re.sub(r"\\(x[0-9a-f]{2}|.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(
                m.group(1), chr(int(m.group(1)[1:], 16)) if m.group(1).startswith("x") else m.group(1)), literal)
        values.append(value)
    return values


def test_llamacpp_case_has_the_shape_and_exact_strings():
    source = load_causes(HFJS)
    cause = dict(source.causes[0])
    cause["repro"] = dict(cause["repro"], template='{{ "a\\"b?\x01c" }}\n\t{{ bos_token }}',
                          reference={"kind": "rendered", "text": 'a"b?\x01c\n\t'})
    (text,) = emit(cause, "llamacpp", source.runner, source.reference).values()
    fields = dict(re.findall(r"/\* \.(\w+)= \*/ (.*),$", text, re.M))
    assert list(fields) == ["name", "template_str", "expected_output_jinja", "bos_token", "eos_token",
                            "supported_with_jinja", "conversation", "add_generation_prompt"]
    assert fields["add_generation_prompt"] == "false" and _c_literal_values(fields["conversation"]) == ["", ""]
    assert _c_literal_values(fields["template_str"]) == [cause["repro"]["template"]]
    assert _c_literal_values(fields["expected_output_jinja"]) == ['a"b?\x01c\n\t']
    assert "common_chat_templates_apply" in text


def test_json_vector_validates_against_the_vector_schema():
    from conformance import schema_validator

    validator = schema_validator("vector.schema.json")
    for path in (MINIJINJA, HFJS, ROOT / "conformance" / "expectations" / "hfjs.json"):
        source = load_causes(path)
        for cause in source.causes[:40]:
            header, cell = (json.loads(line) for line in
                            next(iter(emit(cause, "json", source.runner, source.reference).values())).splitlines())
            validator.validate(header)
            validator.validate(cell)
            assert cell["template"]["source"] == cause["repro"]["template"]
            reference = cause["repro"]["reference"]
            assert cell["expected"]["kind"] == reference["kind"]
            if reference["kind"] == "rendered":
                assert cell["expected"]["text"] == reference["text"]
    assert vector_cell(load_causes(MINIJINJA).causes[0])["expected"] == {
        "kind": "rendered", "text": "", "bytes": 0,
        "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}


def test_issue_names_versions_bytes_and_the_semantics_rule():
    source = load_causes(BASELINE)
    cause = source.find(_r11_cause_id())
    (text,) = emit(cause, "issue", dict(source.runner, version="3.1.0"), source.reference).values()
    assert "- Engine: minijinja 3.1.0" in text and "- Reference: hf" in text
    assert cause["repro"]["template"] in text
    assert json.dumps(cause["repro"]["reference"]["text"]) in text and json.dumps(cause["repro"]["engine"]["text"]) in text
    # The rule the reason cites, quoted from SEMANTICS.md.
    assert "SEMANTICS.md R11:" in text and "> **R11. Reasoning fields are aliased**" in text


def test_cli_emits_from_the_bundled_baseline_and_names_bad_input(tmp_path):
    env = {"PYTHONPATH": str(ROOT)}
    cause = load_causes(BASELINE).find(_r11_cause_id())
    done = _run([sys.executable, "-m", "conformance.cli", "explain", "--runner", "minijinja", "--emit", "issue",
                 "--cause", cause["id"][:10]], tmp_path, env)
    # the issue is titled by the cause's title: the data that owns the difference, a message's reasoning
    assert done.returncode == 0 and done.stdout.startswith(f"# {cause['title']}\n"), done.stderr
    assert cause["title"].startswith("a message's reasoning under one of its names")
    done = _run([sys.executable, "-m", "conformance.cli", "explain", "--emit", "minijinja", "--from", str(MINIJINJA),
                 "--out", str(tmp_path / "out")], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".expected", ".py", ".snap", ".txt"]
    again = _run([sys.executable, "-m", "conformance.cli", "explain", "--emit", "minijinja", "--from", str(MINIJINJA),
                  "--out", str(tmp_path / "out")], tmp_path, env)
    assert again.returncode != 0 and "exists (--force overwrites)" in again.stderr
    missing = _run([sys.executable, "-m", "conformance.cli", "explain", "--emit", "json", "--from", str(MINIJINJA),
                    "--cause", "c-nope"], tmp_path, env)
    assert missing.returncode != 0 and "minijinja-2.9.0.explain.json: no cause matches 'c-nope'" in missing.stderr
    neither = _run([sys.executable, "-m", "conformance.cli", "explain", "--emit", "json"], tmp_path, env)
    assert neither.returncode == 2 and "give --from" in neither.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(EmitError, match="bad.json: not a baseline or an explanation"):
        load_causes(bad)


def test_render_reference_takes_the_expected_output_from_the_reference_runner(tmp_path):
    """--render-reference renders the reproducer through hf: a wrong recorded outcome is replaced and said."""
    data = json.loads(MINIJINJA.read_text())
    data["causes"][0]["repro"]["reference"] = {"kind": "rendered", "text": "not what hf renders"}
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    done = _run([sys.executable, "-m", "conformance.cli", "explain", "--emit", "json", "--from", str(tampered),
                 "--render-reference"], tmp_path, {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    header, cell = (json.loads(line) for line in done.stdout.splitlines())
    assert cell["expected"]["text"] == "" and "not the recorded outcome" in done.stderr
    assert header["reference"]["name"] == "hf" and header["reference"]["version"]
