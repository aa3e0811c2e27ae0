"""A cause's reproducer as a ready regression test in an engine's own format (`chatgold explain --emit`).

A cause comes from a baseline (conformance/expectations/*.json) or an explanation (`chatgold explain --json`):
its reproducer is a template, a conversation and the two outcomes, the reference's and the engine's. Every
format below carries the template and the variables exactly as the engine's runner binds them (bos/eos only
when set, the kwargs, messages, tools, documents, add_generation_prompt; SEMANTICS.md R6-R10) and the
reference's output as the expected bytes, so the emitted test fails while the engine has the cause and passes
once it is fixed. Pure text: this module imports no engine (conformance/report/ never does).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Optional

from conformance.files import ENCODING_ERRORS

FORMATS = ("pytest", "minijinja", "hfjs", "llamacpp", "json", "issue")
# Runners whose engine is MiniJinja's Python binding: their pytest renders through it.
MINIJINJA_RUNNERS = ("minijinja", "tgi", "mistralrs", "mistralrs-server", "sglang")
SEMANTICS = Path(__file__).resolve().parents[2] / "runners" / "protocol" / "SEMANTICS.md"


def own_formats(runner: dict) -> tuple:
    """The formats worth offering for an engine: its own test suite's, then the plain vector and the issue."""
    name = str(runner.get("name", "")).split("@")[0]
    if name in MINIJINJA_RUNNERS:
        own = ("minijinja", "pytest")
    elif name == "hfjs" or runner.get("language") == "javascript":
        own = ("hfjs",)
    elif name.startswith("llamacpp") or name == "llama-cpp-python":
        own = ("llamacpp",) + (("pytest",) if name == "llama-cpp-python" else ())
    elif runner.get("language") == "python":
        own = ("pytest",)
    else:
        own = ()
    return own + ("json", "issue")


class EmitError(ValueError):
    """Bad input to emit: names the file or cause and the problem."""


class CauseSource:
    """The causes of one file, with the engine and reference that produced them."""

    def __init__(self, path, runner: dict, reference: dict, causes: list):
        self.path, self.runner, self.reference, self.causes = Path(path), runner, reference, causes

    def find(self, cause_id: str) -> dict:
        hits = [c for c in self.causes if c.get("id") == cause_id] or \
               [c for c in self.causes if str(c.get("id", "")).startswith(cause_id)]
        if len(hits) != 1:
            known = ", ".join(c.get("id", "?") for c in self.causes[:8])
            raise EmitError(f"{self.path}: {'no' if not hits else 'more than one'} cause matches {cause_id!r} "
                            f"({len(self.causes)} causes: {known}{', ...' if len(self.causes) > 8 else ''})")
        return hits[0]


def load_causes(path) -> CauseSource:
    """A baseline (format 2, `runner` a name) or an explanation (format 1, `runner` its describe())."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmitError(f"{path}: cannot read causes: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("causes"), list):
        raise EmitError(f"{path}: not a baseline or an explanation (no `causes` list)")
    runner = data.get("runner")
    if isinstance(runner, str):
        runner = {"name": runner}
    if not isinstance(runner, dict) or "name" not in runner:
        raise EmitError(f"{path}: no `runner` naming the engine")
    reference = data.get("reference") if isinstance(data.get("reference"), dict) else {"name": "hf"}
    for cause in data["causes"]:
        if not isinstance(cause, dict) or not isinstance(cause.get("repro"), dict) or \
                "template" not in cause["repro"] or "case" not in cause["repro"]:
            raise EmitError(f"{path}: cause {cause.get('id') if isinstance(cause, dict) else cause!r} has no "
                            f"reproducer (template and case)")
    return CauseSource(path, runner, reference, data["causes"])


def engine_context(repro: dict) -> dict:
    """The variables as the engine's runner binds them (HF's apply_chat_template order, SEMANTICS.md R6-R10)."""
    case = repro["case"]
    context = {}
    if repro.get("bos_token") is not None:
        context["bos_token"] = repro["bos_token"]
    if repro.get("eos_token") is not None:
        context["eos_token"] = repro["eos_token"]
    context.update(case.get("kwargs") or {})
    context.update(messages=case["messages"], tools=case.get("tools"), documents=case.get("documents"),
                   add_generation_prompt=bool(case.get("add_generation_prompt")))
    return context


def expected_of(repro: dict) -> dict:
    """The reference's outcome: {kind: rendered, text} or {kind: raised, message, refusal}."""
    reference = repro.get("reference") or {}
    if reference.get("kind") not in ("rendered", "raised"):
        raise EmitError(f"the reproducer's reference outcome is {reference.get('kind')!r}: nothing to expect")
    return reference


def _slug(cause: dict) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(cause["id"]).lower()).strip("_")


def _py(value) -> str:
    """A Python literal for JSON data (repr keeps every code point exact; ascii() keeps the file ASCII)."""
    return ascii(value)


def _refused_text(expected: dict) -> str:
    return expected.get("message") or expected.get("text") or ""


def _header(cause: dict, runner: dict, reference: dict, fmt: str) -> list:
    return [f"chatgold cause {cause['id']}: {cause.get('title', '')}",
            f"engine: {_version_line(runner)}; expected: the reference, {_version_line(reference)} "
            f"(runners/protocol/SEMANTICS.md)",
            f"written by `chatgold explain --emit {fmt}`"]


def _version_line(described: dict) -> str:
    name = described.get("name", "?")
    version = described.get("version")
    return f"{name} {version}" if version and f"@{version}" not in name else name


# -- pytest -----------------------------------------------------------------------------------------------

_PYTEST_MINIJINJA = '''
def render():
    """MiniJinja's Python binding configured as chatgold's minijinja runner: trim/lstrip blocks, lenient undefined,
    pycompat where the binding has it; data bound as native MiniJinja values (a root template of literals)."""
    import minijinja

    def raise_exception(message=""):
        raise RaisedByTemplate(str(message))

    options = dict(trim_blocks=True, lstrip_blocks=True, undefined_behavior="lenient", pycompat=True,
                   globals={"raise_exception": raise_exception, "strftime_now": lambda fmt: NOW.strftime(str(fmt))})
    try:
        env = minijinja.Environment(**options)
    except TypeError:  # bindings before 2.9.0 have no pycompat
        options.pop("pycompat")
        env = minijinja.Environment(**options)
    try:
        env.add_template("chat_template", TEMPLATE)
    except Exception as exc:
        raise CompileRefusal(str(exc)) from exc
    strings = {k: v for k, v in CONTEXT.items() if isinstance(v, str)}
    root = "".join("{%% set %s = %s %%}" % (k, literal(v)) for k, v in CONTEXT.items() if k not in strings)
    env.add_template("root", root + '{% include "chat_template" %}')
    return env.render_template("root", **strings)


def literal(value):
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return "{" + ", ".join(json.dumps(str(k)) + ": " + literal(v) for k, v in value.items()) + "}"
'''

_PYTEST_JINJA2 = '''
def render():
    """jinja2 as transformers configures it (SEMANTICS.md R13-R19): the engine under test replaces this."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise RaisedByTemplate(str(message))

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    try:
        template = env.from_string(TEMPLATE)
    except Exception as exc:
        raise CompileRefusal(str(exc)) from exc
    return template.render(**CONTEXT)
'''


def emit_pytest(cause, runner, reference, engine: Optional[str] = None) -> dict:
    repro = cause["repro"]
    expected = expected_of(repro)
    engine = engine or ("minijinja" if runner.get("name", "").split("@")[0] in MINIJINJA_RUNNERS else "jinja2")
    if engine not in ("minijinja", "jinja2"):
        raise EmitError(f"pytest engine {engine!r}: expected minijinja or jinja2")
    lines = ['"""' + "\n".join(_header(cause, runner, reference, "pytest")).replace('"""', "'''")
             + f"\nrenders with: {engine}\n" + '"""',
             "import datetime", "import json", "",
             f"TEMPLATE = {_py(repro['template'])}",
             f"CONTEXT = json.loads({_py(json.dumps(engine_context(repro), ensure_ascii=False))})",
             f"NOW = datetime.datetime.fromisoformat({_py(repro['case'].get('now') or '2025-06-15T09:30:00+00:00')})"
             ".replace(tzinfo=None)"]
    if expected["kind"] == "rendered":
        lines.append(f"EXPECTED = {_py(expected['text'])}")
    else:
        lines.append(f"EXPECTED_REFUSAL = {_py(expected.get('refusal') or 'unknown')}")
        lines.append(f"EXPECTED_MESSAGE = {_py(_refused_text(expected))}")
    lines += ["", "", "class RaisedByTemplate(Exception):", "    pass", "", "",
              "class CompileRefusal(Exception):", "    pass", ""]
    lines.append((_PYTEST_MINIJINJA if engine == "minijinja" else _PYTEST_JINJA2).strip("\n"))
    name = f"test_{_slug(cause)}"
    if expected["kind"] == "rendered":
        lines += ["", "", f"def {name}():",
                  "    # The reference's output exactly (SEMANTICS.md R24: equal text is equal UTF-8 bytes).",
                  "    assert render() == EXPECTED"]
    else:
        lines += ["", "", f"def {name}():", "    # The reference refuses this conversation (SEMANTICS.md R23).",
                  "    import pytest", "",
                  "    with pytest.raises(Exception) as raised:", "        render()",
                  "    # Of the same kind: a template the reference compiles must compile (SEMANTICS.md R23).",
                  "    assert (raised.type is CompileRefusal) == (EXPECTED_REFUSAL == 'compile'), raised.value",
                  "    if EXPECTED_REFUSAL == 'raise':",
                  "        # raise_exception's message is the template's own: it must come through unchanged",
                  "        assert raised.type is RaisedByTemplate or EXPECTED_MESSAGE.split(': ', 1)[-1] in str(raised.value)"]
    return {f"test_{_slug(cause)}.py": "\n".join(lines) + "\n"}


# -- MiniJinja snapshot input -------------------------------------------------------------------------------

_MINIJINJA_CHECK = '''"""{doc}
The snapshot input beside this file ({name}.txt: the context as JSON, a line `---`, the template) rendered through
MiniJinja's Python binding, configured as chatgold's minijinja runner, against {name}.expected (exact bytes).
Run: python -m pytest {file} (or python {file})."""
import datetime
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOW = datetime.datetime.fromisoformat({now}).replace(tzinfo=None)
REFUSED = {refused}


def literal(value):
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return "{{" + ", ".join(json.dumps(str(k)) + ": " + literal(v) for k, v in value.items()) + "}}"


def render():
    import minijinja

    source = (HERE / "{name}.txt").read_text(encoding="utf-8")
    context_text, template = source.split("\\n---\\n", 1)
    context = json.loads(context_text)

    def raise_exception(message=""):
        raise RuntimeError(str(message))

    options = dict(trim_blocks=True, lstrip_blocks=True, undefined_behavior="lenient", pycompat=True,
                   globals={{"raise_exception": raise_exception, "strftime_now": lambda fmt: NOW.strftime(str(fmt))}})
    try:
        env = minijinja.Environment(**options)
    except TypeError:  # bindings before 2.9.0 have no pycompat
        options.pop("pycompat")
        env = minijinja.Environment(**options)
    try:
        env.add_template("chat_template", template)
    except Exception as exc:
        raise CompileRefusal(str(exc)) from exc
    # Structured data as native MiniJinja values, as a Rust embedder's serde data is.
    strings = {{k: v for k, v in context.items() if isinstance(v, str)}}
    root = "".join("{{%% set %s = %s %%}}" % (k, literal(v)) for k, v in context.items() if k not in strings)
    env.add_template("root", root + '{{% include "chat_template" %}}')
    return env.render_template("root", **strings)


class CompileRefusal(Exception):
    pass


def {test}():
    expected = (HERE / "{name}.expected").read_bytes()
    if REFUSED:
        try:
            render()
        except CompileRefusal:
            # A refusal of the same kind only (SEMANTICS.md R23).
            assert REFUSED == "compile", "the reference compiles this template; the engine refuses to"
            return
        except Exception:
            assert REFUSED != "compile", "the reference refuses to compile this template; the engine compiles it"
            return
        raise AssertionError("the reference refuses this conversation; the engine rendered it")
    assert render().encode("utf-8") == expected


if __name__ == "__main__":
    {test}()
    print("ok")
'''


def emit_minijinja(cause, runner, reference) -> dict:
    repro = cause["repro"]
    expected = expected_of(repro)
    name = _slug(cause)
    context = engine_context(repro)
    refused = expected["kind"] != "rendered"
    text = _refused_text(expected) if refused else expected["text"]
    doc = "\n".join(_header(cause, runner, reference, "minijinja"))
    check = _MINIJINJA_CHECK.format(doc=doc.replace('"""', "'''"), name=name, file=f"test_{name}_minijinja.py",
                                    now=_py(repro["case"].get("now") or "2025-06-15T09:30:00+00:00"),
                                    refused=repr((expected.get("refusal") or "unknown") if refused else ""),
                                    test=f"test_{name}")
    # MiniJinja's own snapshot tests: tests/inputs/<name>.txt and insta's snapshot of its output.
    snapshot = ("---\nsource: minijinja/tests/test_templates.rs\n"
                f"description: {json.dumps(repro['template'][:200], ensure_ascii=False)}\n"
                f"info: {json.dumps(context, ensure_ascii=False)}\n"
                f"input_file: minijinja/tests/inputs/{name}.txt\n---\n"
                + (f"!!!ERROR!!! the reference refuses: {text}" if refused else text) + "\n")
    return {f"{name}.txt": json.dumps(context, ensure_ascii=False, indent=2) + "\n---\n" + repro["template"],
            f"{name}.expected": text,
            f"test_templates__vm@{name}.txt.snap": snapshot,
            f"test_{name}_minijinja.py": check}


# -- @huggingface/jinja -----------------------------------------------------------------------------------

_HFJS = '''// {doc}
// Run: node {file} (finds @huggingface/jinja through $HFJS_NODE_MODULES or the usual node_modules lookup).
import {{ test }} from "node:test";
import assert from "node:assert/strict";
import {{ join }} from "node:path";
import {{ readFileSync }} from "node:fs";
import {{ pathToFileURL }} from "node:url";

async function loadTemplate() {{
  const dir = process.env.HFJS_NODE_MODULES;
  if (!dir) return (await import("@huggingface/jinja")).Template;
  const root = join(dir, "@huggingface", "jinja");
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const entry = pkg.exports?.["."]?.import ?? pkg.module ?? pkg.main;
  return (await import(pathToFileURL(join(root, entry)).href)).Template;
}}

const TEMPLATE = {template};
const VARIABLES = {variables};
const NOW = {now};
const EXPECTED = {expected};
const REFUSED = {refused};

// strftime_now reads `new Date()`: the clock is frozen at the case's time, in UTC.
process.env.TZ = "UTC";
const RealDate = globalThis.Date;
globalThis.Date = class extends RealDate {{
  constructor(...args) {{ if (args.length === 0) super(RealDate.parse(NOW)); else super(...args); }}
  static now() {{ return RealDate.parse(NOW); }}
}};

test({name}, async () => {{
  const Template = await loadTemplate();
  // The reference's refusal, if any: {refusal} {expected_comment}
  if (REFUSED === "compile") {{
    assert.throws(() => new Template(TEMPLATE));
    return;
  }}
  const template = new Template(TEMPLATE);  // the reference compiles it: so must the engine
  const render = () => template.render(structuredClone(VARIABLES));
  if (REFUSED) {{
    assert.throws(render);
  }} else {{
    assert.equal(render(), EXPECTED);
  }}
}});
'''


def emit_hfjs(cause, runner, reference) -> dict:
    repro = cause["repro"]
    expected = expected_of(repro)
    refused = expected["kind"] != "rendered"
    # As transformers.js's apply_chat_template binds them: a special token only when set, then the kwargs.
    variables = {"messages": repro["case"]["messages"], "add_generation_prompt": bool(repro["case"].get("add_generation_prompt")),
                 "tools": repro["case"].get("tools"), "documents": repro["case"].get("documents")}
    for token in ("bos_token", "eos_token"):
        if repro.get(token):
            variables[token] = repro[token]
    variables.update(repro["case"].get("kwargs") or {})
    name = _slug(cause)
    js = _HFJS.format(doc="\n// ".join(_header(cause, runner, reference, "hfjs")), file=f"{name}.test.mjs",
                      template=json.dumps(repro["template"]), variables=json.dumps(variables),
                      now=json.dumps(repro["case"].get("now") or "2025-06-15T09:30:00+00:00"),
                      expected=json.dumps(_refused_text(expected) if refused else expected["text"]),
                      refused=json.dumps((expected.get("refusal") or "unknown") if refused else ""),
                      refusal=expected.get("refusal") or "unknown" if refused else "no refusal",
                      name=json.dumps(f"chatgold {cause['id']}"),
                      expected_comment=_refused_text(expected).replace("\n", " ")[:200] if refused else "")
    return {f"{name}.test.mjs": js}


# -- llama.cpp ------------------------------------------------------------------------------------------

def c_string(text: str) -> str:
    """A C++ string literal of `text` (UTF-8 kept as is; control characters escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append('\\x%02x""' % ord(ch))  # end the literal so a following hex digit is not swallowed
        elif ch == "?":
            out.append("\\?")  # no trigraphs
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def emit_llamacpp(cause, runner, reference) -> dict:
    """A case in the shape of llama.cpp's tests/test-chat-template.cpp entries (name, template_str,
    expected_output_jinja, bos_token, eos_token, supported_with_jinja, then the conversation), in a block that
    runs it through common_chat_templates_apply as that file's jinja path does. It is a block of its own, not
    a `test_cases` entry: those all render one fixed conversation with add_generation_prompt true."""
    repro = cause["repro"]
    expected = expected_of(repro)
    case = repro["case"]
    # simple_msg always sets content: a message without one (undefined in the template) is not plain
    plain = all(isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str)
                for m in case["messages"])
    generation = "true" if case.get("add_generation_prompt") else "false"
    lines = ["// " + line for line in _header(cause, runner, reference, "llamacpp")]
    lines.append("// Paste into main_automated_tests() of tests/test-chat-template.cpp (it uses simple_msg from there).")
    if expected["kind"] != "rendered":
        lines.append(f"// The reference refuses this conversation: {_refused_text(expected)}")
    if repro.get("bos_token") is None or repro.get("eos_token") is None:
        lines.append("// The reference leaves an unset special token undefined (SEMANTICS.md R6); here it is \"\".")
    if not plain or case.get("tools") or case.get("kwargs") or case.get("documents"):
        lines += ["// The conversation is not plain role/content strings (content parts, tool calls, a missing content,",
                  "// tools, kwargs):",
                  "// set them on common_chat_msg / inputs.tools, or give this JSON to test-chat-template's file mode:",
                  "// " + json.dumps(engine_context(repro), ensure_ascii=False)]
    messages = ", ".join("{" + c_string(str(m.get("role", ""))) + ", " + c_string(str(m.get("content") or "")) + "}"
                         for m in case["messages"] if isinstance(m, dict))
    text = expected.get("text", "") if expected["kind"] == "rendered" else ""
    lines += ["    {",
              "        struct {",
              "            std::string name, template_str, expected_output_jinja, bos_token, eos_token;",
              "            bool supported_with_jinja;",
              "            std::vector<std::pair<std::string, std::string>> conversation;",
              "            bool add_generation_prompt;",
              "        } test_case {",
              f"            /* .name= */ {c_string('chatgold ' + cause['id'] + ': ' + cause.get('title', ''))},",
              f"            /* .template_str= */ {c_string(repro['template'])},",
              f"            /* .expected_output_jinja= */ {c_string(text)},",
              f"            /* .bos_token= */ {c_string(repro.get('bos_token') or '')},",
              f"            /* .eos_token= */ {c_string(repro.get('eos_token') or '')},",
              "            /* .supported_with_jinja= */ true,",
              f"            /* .conversation= */ {{{messages}}},",
              f"            /* .add_generation_prompt= */ {generation},",
              "        };",
              "        std::vector<common_chat_msg> msgs;",
              "        for (const auto & m : test_case.conversation) {",
              "            msgs.push_back(simple_msg(m.first, m.second));",
              "        }",
              "        auto tmpls = common_chat_templates_init(/* model= */ nullptr, test_case.template_str, "
              "test_case.bos_token, test_case.eos_token);",
              "        common_chat_templates_inputs inputs;",
              "        inputs.use_jinja = true;",
              "        inputs.messages = msgs;",
              "        inputs.add_generation_prompt = test_case.add_generation_prompt;"]
    if expected["kind"] == "rendered":
        lines += ["        assert(common_chat_templates_apply(tmpls.get(), inputs).prompt == test_case.expected_output_jinja);"]
    else:
        lines += ["        bool refused = false;",
                  "        try { common_chat_templates_apply(tmpls.get(), inputs); } catch (const std::exception &) { refused = true; }",
                  "        assert(refused);"]
    lines.append("    }")
    return {f"{_slug(cause)}.test-chat-template.cpp": "\n".join(lines) + "\n"}


# -- plain vector ---------------------------------------------------------------------------------------

def vector_cell(cause) -> dict:
    """One cell of conformance/schemas/vector.schema.json (format 2): the reproducer with the reference's outcome."""
    repro = cause["repro"]
    expected = expected_of(repro)
    source = repro["template"]
    case = {"id": f"{cause['id']}-case", "description": cause.get("title", "")}
    for key in ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "kwargs", "now"):
        case[key] = repro["case"].get(key, {"kwargs": {}, "add_generation_prompt": False,
                                            "continue_final_message": False}.get(key))
    text = expected.get("text", "") if expected["kind"] == "rendered" else _refused_text(expected)
    out = {"kind": expected["kind"], "text": text, "bytes": len(text.encode("utf-8", ENCODING_ERRORS)),
           "sha256": hashlib.sha256(text.encode("utf-8", ENCODING_ERRORS)).hexdigest()}
    if expected["kind"] == "raised":
        kind = expected.get("refusal") if expected.get("refusal") in ("compile", "raise", "render") else "render"
        type_name, _, message = text.partition(": ")
        out["refusal"] = {"kind": kind, "type": type_name if message else "TemplateError", "message": message or text}
    return {"record": "cell",
            "template": {"id": str(cause["id"]).lower(), "sha256": hashlib.sha256(source.encode("utf-8", ENCODING_ERRORS)).hexdigest(),
                         "source": source, "bos_token": repro.get("bos_token"), "eos_token": repro.get("eos_token")},
            "case": case, "expected": out}


def emit_json(cause, runner, reference) -> dict:
    header = {"record": "header", "format": 2, "semantics": "runners/protocol/SEMANTICS.md",
              "reference": {k: str(v) for k, v in reference.items() if k in ("name", "version")},
              "cells": 1, "templates": 1, "cases": 1, "bindings": False}
    return {f"{_slug(cause)}.vectors.jsonl": json.dumps(header, ensure_ascii=False) + "\n"
            + json.dumps(vector_cell(cause), ensure_ascii=False) + "\n"}


# -- issue ------------------------------------------------------------------------------------------------

def semantics_rules(text: str) -> dict:
    """{"R11": the rule's paragraph} for every rule of SEMANTICS.md that `text` names."""
    wanted = sorted(set(re.findall(r"\bR(\d{1,2})\b", text)), key=int)
    if not wanted or not SEMANTICS.is_file():
        return {}
    body = SEMANTICS.read_text(encoding="utf-8")
    rules = {}
    for number in wanted:
        found = re.search(rf"^\*\*R{number}\. .*?(?=^\*\*R\d+\. |^## |\Z)", body, re.S | re.M)
        if found:
            rules[f"R{number}"] = found.group(0).strip()
    return rules


def _fence(text: str, lang: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text}\n{fence}"


def _outcome_text(outcome: dict) -> str:
    if outcome.get("kind") == "rendered":
        return outcome.get("text", "")
    return f"({outcome.get('kind')}{', ' + outcome['refusal'] if outcome.get('refusal') else ''}) " \
           f"{outcome.get('message') or outcome.get('text') or ''}"


def emit_issue(cause, runner, reference) -> dict:
    repro = cause["repro"]
    expected = expected_of(repro)
    engine_out = repro.get("engine") or {}
    parts = [f"# {cause.get('title', cause['id'])}", "",
             f"- Engine: {_version_line(runner)}",
             f"- Reference: {_version_line(reference)} (HF transformers `apply_chat_template`, the rules in "
             "chatgold's runners/protocol/SEMANTICS.md)",
             f"- chatgold cause: `{cause['id']}`"
             + (f", {len(cause['cells'])} cell(s) in {cause.get('templates', '?')} template(s)" if cause.get("cells") else ""),
             "", "## Reproducer", "", "Template:", "", _fence(repro["template"], "jinja"), "",
             "Variables (as the engine is given them):", "",
             _fence(json.dumps(engine_context(repro), ensure_ascii=False, indent=2), "json"), "",
             "## Expected (the reference)", "", _fence(_outcome_text(expected)), "",
             f"Bytes: `{json.dumps(expected.get('text', ''), ensure_ascii=False)}`" if expected["kind"] == "rendered" else "",
             "", "## Actual (the engine)", "", _fence(_outcome_text(engine_out)), ""]
    if engine_out.get("kind") == "rendered":
        parts += [f"Bytes: `{json.dumps(engine_out.get('text', ''), ensure_ascii=False)}`", ""]
    if cause.get("reason"):
        parts += ["## Why", "", cause["reason"], ""]
    rules = semantics_rules(" ".join(str(cause.get(k, "")) for k in ("reason", "title")))
    if rules:
        parts += ["## The reference's rule", ""]
        for rule, paragraph in rules.items():
            parts += [f"SEMANTICS.md {rule}:", "", "> " + paragraph.replace("\n", "\n> "), ""]
    parts += ["---", "Written by `chatgold explain --emit issue`; `--emit pytest|minijinja|hfjs|llamacpp|json` "
              "writes the same reproducer as a regression test."]
    return {f"{_slug(cause)}.issue.md": "\n".join(p for p in parts if p is not None) + "\n"}


def emit(cause: dict, fmt: str, runner: dict, reference: dict, engine: Optional[str] = None) -> dict:
    """{file name: text} for one cause in one format."""
    if fmt not in FORMATS:
        raise EmitError(f"--emit {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt == "pytest":
        return emit_pytest(cause, runner, reference, engine)
    return {"minijinja": emit_minijinja, "hfjs": emit_hfjs, "llamacpp": emit_llamacpp, "json": emit_json,
            "issue": emit_issue}[fmt](cause, runner, reference)


def write_emitted(files: dict, out_dir, force: bool = False) -> list:
    """Write the files into out_dir (created); an existing file is overwritten only with force."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clashes = [out / name for name in files if (out / name).exists()]
    if clashes and not force:
        raise EmitError(f"{clashes[0]} exists (--force overwrites)")
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8", errors=ENCODING_ERRORS)
        written.append(path)
    return written
