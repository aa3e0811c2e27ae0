"""The ollama runner: Ollama's template choice (our implementation of its rules), its Go harness (real Go
text/template, built by the project's setup into the cache), checked against the Ollama goldens ggufdoctor
recorded from Ollama's own Go template package, and its chat route's refusals and routes.

Go is required (scripts/setup.sh installs Debian's golang-go): without it these tests fail, never skip.
"""
from __future__ import annotations

import json
import random
import subprocess

import pytest

from runners.base import Raised, RefusalKind, Rendered, RenderRequest, Skipped
from runners.command import CommandRunner
from runners.ollama import OllamaRunner, selection
from runners.ollama.build import ensure_harness, harness_path, source_digest

DATA = selection.DATA
NOW = "2025-06-15T09:30:00+00:00"


@pytest.fixture(scope="session")
def harness():
    return str(ensure_harness())


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char != b[j - 1]))
        previous = current
    return previous[-1]


def test_the_imported_data_is_what_the_pinned_wheel_shipped():
    import hashlib

    listed = dict(line.split()[::-1] for line in (DATA / "sources.sha256").read_text().splitlines() if line.strip())
    assert len([name for name in listed if name.endswith(".gotmpl")]) == 20 and "index.json" in listed
    for name, digest in listed.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    assert "ce27c263f206c5666554086081504f2c75cf1309bc3cc512f8d85047a369c398" in (DATA / "PROVENANCE").read_text()
    assert json.loads((DATA / "OLLAMA_PIN").read_text())["commit"].startswith("b79067b0")


# -- selection ---------------------------------------------------------------------------------------------

def test_bounded_distance_is_levenshtein_below_the_cut():
    rng = random.Random(7)
    for _ in range(2000):
        a = "".join(rng.choice("ab\u00e9\U0001F600") for _ in range(rng.randint(0, 25)))
        b = "".join(rng.choice("ab\u00e9\U0001F600") for _ in range(rng.randint(0, 25)))
        cut = rng.randint(1, 20)
        assert selection.bounded_distance(a, b, cut) == min(levenshtein(a, b), cut), (a, b, cut)


def test_the_histogram_bound_never_exceeds_the_distance_and_leaves_the_choice_unchanged():
    from collections import Counter

    rng = random.Random(11)
    for _ in range(2000):
        a = "".join(rng.choice("abc\u00e9") for _ in range(rng.randint(0, 20)))
        b = "".join(rng.choice("abc\u00e9") for _ in range(rng.randint(0, 20)))
        assert selection.histogram_bound(Counter(a), Counter(b)) <= levenshtein(a, b), (a, b)
    # Edited index entries, near and far: the pruned search picks what the full one picks.
    entries = selection.index()
    for _ in range(40):
        name, text = rng.choice(entries)
        chars = list(text)
        for _ in range(rng.choice((3, 40, 90, 120))):
            chars[rng.randrange(len(chars))] = rng.choice("{}%- x\n")
        edited = "".join(chars)
        full = min(((selection.bounded_distance(edited, other), index, other_name)
                    for index, (other_name, other) in enumerate(entries)), default=None)
        expected = (full[2], full[0]) if full[0] < selection.CUTOFF else (None, None)
        assert selection.detect(edited) == expected


def test_the_choice_is_remembered_on_disk_under_the_data_and_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path))
    name, text = selection.index()[0]
    selection.choose_cached.cache_clear()
    first = selection.choose_cached(text)
    records = list((tmp_path / "ollama-choices").rglob("*.json"))
    assert first == selection.choose(text) and len(records) == 1
    # A later process reads it instead of measuring distances again.
    selection.choose_cached.cache_clear()
    monkeypatch.setattr(selection, "choose", lambda *args: pytest.fail("computed again"))
    assert selection.choose_cached(text) == first
    # A record that cannot be read is computed again and written anew.
    records[0].write_text("{not json")
    selection.choose_cached.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path))
    assert selection.choose_cached(text) == first
    assert json.loads(records[0].read_text())["template"] == name
    selection.choose_cached.cache_clear()


def test_every_index_entry_selects_the_first_entry_with_its_text():
    first = {}
    for name, text in selection.index():
        first.setdefault(text, name)
    for name, text in selection.index():
        assert selection.detect(text) == (first[text], 0)


def test_the_threshold_is_strictly_under_100_and_ties_go_to_the_earlier_entry():
    name, longest = max(selection.index(), key=lambda entry: len(entry[1]))
    assert selection.detect(longest + "x" * 99) == (name, 99)
    assert selection.detect(longest + "x" * 100) == (None, None)
    assert selection.choose(longest + "x" * 100).route == selection.ROUTE_FALLBACK
    entries = (("first", "abcx"), ("second", "abcy"))
    assert selection.detect("abcz", entries) == ("first", 1)
    assert selection.detect("abcz", entries[::-1]) == ("second", 1)


def test_architecture_renderers_and_the_gguf_preferred_route():
    assert selection.choose("anything", "gemma4").route == selection.ROUTE_RENDERER
    assert selection.choose("anything", "nemotron_h_moe").renderer == "nemotron-3-nano"
    # Llama 3.1's template (the index's second llama3-instruct entry) mentions tools, a capability the
    # llama3-instruct Go template lacks: detected, yet the GGUF's Jinja is kept (server/images.go:295-307).
    llama3 = [text for name, text in selection.index() if name == "llama3-instruct"]
    assert ["tools" in text for text in llama3] == [False, True]
    assert selection.choose(llama3[0]).facts() == {"ollama.route": selection.ROUTE_GO,
                                                   "ollama.template": "llama3-instruct", "ollama.distance": 0}
    assert selection.choose(llama3[1]).facts() == {"ollama.route": selection.ROUTE_PREFER,
                                                   "ollama.template": "llama3-instruct", "ollama.distance": 0}


def test_go_template_vars_agree_with_the_parse_tree(harness):
    for path in sorted(DATA.glob("*.gotmpl")):
        done = subprocess.run([harness, "--vars"], input=path.read_text(encoding="utf-8"), capture_output=True,
                              text=True, check=True)
        from_go = {name for name in json.loads(done.stdout) if not name.startswith("$")}
        assert selection.go_template_vars(selection.go_template(path.stem)) == from_go, path.name


def test_the_harness_is_cached_by_its_source_digest(harness):
    assert harness == str(harness_path())
    assert source_digest()[:16] in harness


# -- the goldens ggufdoctor recorded from Ollama's Go template package ---------------------------------------

def golden_cells():
    fixtures = json.loads((DATA / "fixtures.json").read_text(encoding="utf-8"))
    goldens = json.loads((DATA / "goldens.json").read_text(encoding="utf-8"))
    assert goldens["corpus_version"] == fixtures["version"]
    cells = []
    for name, renders in sorted(goldens["renders"].items()):
        for fixture in fixtures["fixtures"]:
            context = fixture["context"]
            kwargs = {"enable_thinking": context["enable_thinking"]} if "enable_thinking" in context else {}
            request = RenderRequest.make(selection.go_template(name), context["messages"],
                                         tools=context.get("tools"), kwargs=kwargs, now=NOW,
                                         add_generation_prompt=context["add_generation_prompt"],
                                         template_id=name, case_id=fixture["name"])
            cells.append((request, renders[fixture["name"]]))
    return cells


def test_every_recorded_ollama_golden_agrees(harness):
    cells = golden_cells()
    assert len(cells) == 200  # 20 Go templates x 10 fixtures
    with CommandRunner([harness, "--template-package"], name="ollama-template-package") as runner:
        outcomes = list(runner.render_many([request for request, _ in cells]))
    disagreements, texts, refusals = [], 0, 0
    for (request, golden), outcome in zip(cells, outcomes):
        if isinstance(golden, str):
            texts += 1
            if outcome != Rendered(golden):
                disagreements.append((request.cell(), golden, outcome))
        else:  # typed content: api.Message's Content is a string; Go's decoder refuses it
            refusals += 1
            assert "unrepresentable" in golden
            if not (isinstance(outcome, Raised) and outcome.refusal == RefusalKind.UNSUPPORTED
                    and outcome.message.startswith("json: cannot unmarshal array into Go struct field")
                    and outcome.message.endswith("of type string")):
                disagreements.append((request.cell(), golden, outcome))
    assert (texts, refusals) == (180, 20)
    assert disagreements == []


# -- the runner (chat route) ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runner(harness):
    with OllamaRunner(timeout=20.0) as r:
        yield r


def chat(template, messages, template_id="t", **extra):
    extra.setdefault("add_generation_prompt", True)
    return RenderRequest.make(template, messages, template_id=template_id, now=NOW, **extra)


def entry(name):
    return next(text for entry_name, text in selection.index() if entry_name == name)


WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}]


def test_go_route_renders_the_curated_template_and_refuses_what_ollama_refuses(runner):
    chatml, command_r = entry("chatml"), entry("command-r")
    user = [{"role": "user", "content": "Hi <b> & é"}]
    outcomes = list(runner.render_many([
        chat(chatml, [{"role": "system", "content": "A"}, {"role": "system", "content": "B"}] + user, "chatml"),
        chat(chatml, user, "chatml", tools=WEATHER),
        chat(chatml, user, "chatml", add_generation_prompt=False),
        chat(chatml, user, "chatml", documents=[{"title": "a", "text": "b"}]),
        chat(chatml, user, "chatml", kwargs={"enable_thinking": True}),
        chat(chatml, user, "chatml", kwargs={"custom": 1}),
        chat(chatml, [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "chatml"),
        chat(command_r, user, "command-r", tools=WEATHER),
    ]))
    # Consecutive system messages merge with a blank line (collate); no HTML escaping of message text.
    assert outcomes[0] == Rendered("<|im_start|>system\nA\n\nB<|im_end|>\n<|im_start|>user\nHi <b> & é<|im_end|>\n"
                                   "<|im_start|>assistant\n")
    assert outcomes[1] == Raised("chatgold does not support tools", RefusalKind.UNSUPPORTED)
    assert isinstance(outcomes[2], Skipped) and "add_generation_prompt" in outcomes[2].message
    assert isinstance(outcomes[3], Skipped) and "documents" in outcomes[3].message
    assert outcomes[4] == Raised('"chatgold" does not support thinking', RefusalKind.UNSUPPORTED)
    assert isinstance(outcomes[5], Skipped) and "custom" in outcomes[5].message
    assert isinstance(outcomes[6], Raised) and outcomes[6].refusal == RefusalKind.UNSUPPORTED
    assert isinstance(outcomes[7], Rendered) and "def get_weather(city: string, ) -> List[Dict]" in outcomes[7].text
    facts = runner.template_facts_of([chat(chatml, user, "chatml"), chat(command_r, user, "command-r")])
    assert facts["chatml"] == {"ollama.route": "go-template", "ollama.template": "chatml", "ollama.distance": 0}
    assert facts["command-r"]["ollama.template"] == "command-r"


def test_json_escapes_html_as_go_does_and_tool_calls_reach_the_template(runner):
    command_r = entry("command-r")
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "<Paris & co>"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18"}]
    outcome = runner.render(chat(command_r, messages, "command-r", tools=WEATHER))
    assert isinstance(outcome, Rendered)
    assert '"city":"\\u003cParis \\u0026 co\\u003e"' in outcome.text  # encoding/json's HTML escaping


# -- identify ------------------------------------------------------------------------------------------------

def write_gguf(path, template, architecture="llama"):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "hello"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(template)
    writer.add_tensor("weights", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_identify_names_ollamas_choice_and_the_probe_its_first_differing_case(tmp_path, harness):
    from conformance.analysis.identify import describe, identify_gguf
    from conformance.corpus.manifest import load_corpus
    from conformance.analysis.ollama_choice import probe

    chatml = entry("chatml")
    (finding,) = identify_gguf(write_gguf(tmp_path / "chatml.gguf", chatml), load_corpus())
    assert finding.ollama["ollama.route"] == "go-template" and finding.ollama["ollama.template"] == "chatml"
    assert "uses its Go template chatml (index distance 0)" in describe(tmp_path, [finding], "")
    (gemma4,) = identify_gguf(write_gguf(tmp_path / "g4.gguf", chatml, "gemma4"), load_corpus())
    assert gemma4.ollama["ollama.route"] == "renderer" and gemma4.ollama["ollama.renderer"] == "gemma4"

    found = probe(chatml, "<s>", "</s>", "<gguf>")
    counts, first = found["counts"], found["first_difference"]
    assert counts["cases"] == counts["passed"] + counts["not judged"] + counts["failed"]
    assert counts["passed"] > 0 and counts["failed"] > 0  # e.g. tool cases: the Go template has no tools
    assert first is not None and first["case"] and first["status"]
    finding.ollama["probe"] = found
    assert f"first differing case {first['case']}" in describe(tmp_path, [finding], "")


# -- the Jinja routes: llama.cpp at the build Ollama pins (built by scripts/setup.sh, else on first use) -------

PLAIN = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
THINKING = ("{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}<think></think>"
            "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
TOOLS = "{% if tools %}{{ tools|length }} tools{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"


def test_a_short_unrelated_template_is_taken_for_chatml():
    # 97 edits from the index's first chatml entry: Ollama swaps in its ChatML Go template.
    assert selection.detect(PLAIN) == ("chatml", 97)


def test_fallback_renders_the_jinja_through_llama_cpp_after_ollamas_checks(runner):
    assert selection.choose(THINKING).route == selection.choose(TOOLS).route == selection.ROUTE_FALLBACK
    user = [{"role": "user", "content": "Hi"}]
    outcomes = list(runner.render_many([
        chat(THINKING, user, "thinking"),                                      # thinking on by default
        chat(THINKING, user, "thinking", kwargs={"enable_thinking": False}),
        chat(TOOLS, user, "tools", tools=WEATHER),
        chat(TOOLS, [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "tools"),
        chat(TOOLS, user, "tools", add_generation_prompt=False),
    ]))
    assert outcomes[0] == Rendered("think=True<think></think>[user]Hi")
    assert outcomes[1] == Rendered("think=False<think></think>[user]Hi")
    assert outcomes[2] == Rendered("1 tools[user]Hi")
    assert isinstance(outcomes[3], Raised) and outcomes[3].refusal == RefusalKind.UNSUPPORTED
    assert isinstance(outcomes[4], Skipped)
    assert runner.template_facts_of([chat(TOOLS, user, "tools")])["tools"] == {
        "ollama.route": "fallback", "ollama.template": None, "ollama.distance": None}


def test_the_choice_is_reported_for_cells_the_store_answers_and_candidates_never_overwrite_it(runner):
    """A warm run renders nothing (the result store answers every cell), and a cause reducer's candidates keep
    their original's template id: the report's choice must still be the corpus template's own."""
    from conformance.render.stage import runner_info

    chatml = entry("chatml")
    user = [{"role": "user", "content": "Hi"}]
    candidate = chat(PLAIN + "{# a reducer's candidate #}", user, "kept")  # far from every index entry
    assert selection.choose(candidate.template).route == selection.ROUTE_FALLBACK
    list(runner.render_many([candidate]))
    facts = runner_info(runner, requests=[chat(chatml, user, "kept")])["template_facts"]
    assert facts == {"kept": {"ollama.route": "go-template", "ollama.template": "chatml", "ollama.distance": 0}}


def test_a_reducers_scratch_space_reaches_the_llama_cpp_route(runner, tmp_path):
    """Candidates on the Jinja route write a GGUF each: they go to the reducer's scratch folder, not the models
    cache, and the reducer's idle servers are kept (LlamaCppRunner.scratch_space)."""
    fallback = runner._fallback_runner()
    kept = fallback.models_dir
    with runner.scratch_space(tmp_path, idle=1):
        assert fallback.models_dir == tmp_path and fallback.idle_servers == 1
        assert isinstance(runner.render(chat(TOOLS, [{"role": "user", "content": "Hi"}], "tools")), Rendered)
        assert list(tmp_path.iterdir())
    assert fallback.models_dir == kept
