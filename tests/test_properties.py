"""Golden-free properties through the real reference: each property fails on a template built to break it
(and only with the kind of violation it was built for), and a sound ChatML template passes them all."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from conformance import schema_validator
from conformance.analysis import properties as props
from conformance.corpus.cases import load_cases
from runners.hf import HFRunner

# The text of a message, a string or text parts.
TEXT = ("{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}"
        "{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}")
TURN = "<|im_start|>{{ m.role }}\n" + TEXT + "<|im_end|>\n"


def chatml(turn: str = TURN, head: str = "", prompt: str = "<|im_start|>assistant\n") -> str:
    return (f"{head}{{% for m in messages %}}{turn}{{% endfor %}}"
            f"{{% if add_generation_prompt %}}{prompt}{{% endif %}}")


@dataclass(frozen=True)
class Template:
    id: str
    text: str
    bos_token: str = None
    eos_token: str = None

    def source(self) -> str:
        return self.text


BROKEN = {
    # the turn count at the top: every new turn rewrites the start of the prompt
    "prefix-stability": chatml(head="{{ messages | length }} messages\n"),
    # the generation prompt also changes the first line
    "generation-prompt": chatml(head="{% if add_generation_prompt %}[ANSWER NEXT]\n{% endif %}"),
    # a turn whose text asks a question is never closed
    "marker-balance": chatml(turn="<|im_start|>{{ m.role }}\n" + TEXT
                             + "{% if '?' not in (m.content if m.content is string else '') %}<|im_end|>{% endif %}\n"),
    # the tool list printed as a Python object
    "no-repr-leak": chatml(head="{% if tools %}Tools: {{ tools }}\n{% endif %}"),
    # the clock decides more than a printed date
    "time-invariance": chatml(head="{% if strftime_now('%Y') | int >= 2026 %}Happy new era!\n{% endif %}"),
    # a random number in every prompt
    "determinism": chatml(head="seed {{ range(100000) | random }}\n"),  # the sandbox's largest range
    # only the first two user turns reach the prompt
    "faithfulness": chatml(turn="{% if m.role != 'user' or loop.index0 < 2 %}" + TURN + "{% endif %}"),
}
EXPECTED_KIND = {
    "prefix-stability": "history-rewritten",
    "generation-prompt": "not-an-append",
    "marker-balance": "unclosed-turn",
    "no-repr-leak": "python-repr",
    "time-invariance": "clock-changes-more-than-the-date",
    "determinism": "renders-differ",
    "faithfulness": "drops-content:user",
}
# Templates that only show an intended exception: a printed date, a system message never rendered.
EXCEPTIONS = {
    "time-invariance": (chatml(head="Today is {{ strftime_now('%d %B %Y') }}.\n"), "reads-clock"),
    "faithfulness": (chatml(turn="{% if m.role != 'system' %}" + TURN + "{% endif %}"), "never-renders-content:system"),
}


@pytest.fixture(scope="module")
def records():
    templates = [Template("chatml", chatml())]
    templates += [Template(f"broken-{name}", text) for name, text in BROKEN.items()]
    templates += [Template(f"exception-{name}", text) for name, (text, _) in EXCEPTIONS.items()]
    runner = HFRunner(workers=2)
    try:
        results, failures = props.compute_properties(templates, runner, cases=load_cases())
    finally:
        runner.close()
    assert not failures, failures
    return results


def test_sound_chatml_passes_every_property(records):
    record = records["chatml"]
    assert record["violated"] == []
    for name in ("prefix-stability", "generation-prompt", "marker-balance", "determinism", "time-invariance"):
        assert record["properties"][name]["status"] == "pass", (name, record["properties"][name])
    assert "<|im_start|> ... <|im_end|>" in record["properties"]["marker-balance"]["note"]


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_property_fails_on_a_template_built_to_break_it(records, name):
    record = records[f"broken-{name}"]
    result = record["properties"][name]
    assert result["status"] == "violation", result
    kinds = [v["kind"] for v in result["violations"]]
    assert EXPECTED_KIND[name] in kinds, kinds
    finding = next(v for v in result["violations"] if v["kind"] == EXPECTED_KIND[name])
    assert len(finding["explanation"]) == 2 and finding["explanation"][0] == props.DEMANDS[name]
    assert finding["case"] in finding["cases"] and finding["count"] >= 1
    assert finding["evidence"]
    # the minimal case is the smallest conversation showing it
    sizes = {c.id: props.case_size(c) for c in load_cases()}
    assert sizes[finding["case"]] == min(sizes[c] for c in finding["cases"])


@pytest.mark.parametrize("name", list(EXCEPTIONS))
def test_intended_exceptions_are_counted_apart(records, name):
    result = records[f"exception-{name}"]["properties"][name]
    assert result["status"] == "exception", result
    assert EXCEPTIONS[name][1] in [e["kind"] for e in result["exceptions"]]
    assert result["violations"] == []


def test_marker_balance_names_the_unclosed_turn(records):
    finding = records["broken-marker-balance"]["properties"]["marker-balance"]["violations"][0]
    assert "<|im_start|>" in finding["explanation"][1]
    assert finding["evidence"]["openers"] == ["<|im_start|>"] and finding["evidence"]["closers"] == ["<|im_end|>"]


def test_repr_leak_evidence_points_at_the_repr(records):
    finding = records["broken-no-repr-leak"]["properties"]["no-repr-leak"]["violations"][0]
    assert finding["evidence"]["found"].startswith(("{'", "['"))


def test_records_validate_against_the_schema(records):
    validator = schema_validator("properties.schema.json")
    for record in records.values():
        validator.validate(json.loads(props.encode_properties(record)))


def test_reasoning_dropped_from_past_turns_is_an_intended_exception():
    """Qwen3 drops the reasoning of turns before the last user message: classified, not a violation."""
    from conformance.corpus.manifest import load_corpus

    entry = load_corpus().get("qwen-qwen3-0.6b")
    runner = HFRunner(workers=1)
    try:
        results, _ = props.compute_properties([entry], runner, cases=load_cases())
    finally:
        runner.close()
    result = results["qwen-qwen3-0.6b"]["properties"]["prefix-stability"]
    assert result["status"] == "exception"
    assert [e["kind"] for e in result["exceptions"]] == ["reasoning-dropped"]


def test_summary_counts_templates_per_status(records):
    summary = props.summarize(records)
    assert summary["determinism"]["violation"] == 1
    assert summary["time-invariance"]["exception"] == 1
    assert summary["prefix-stability"]["violation_kinds"]["history-rewritten"] >= 1
    assert all(row["templates"] == len(records) for row in summary.values())


def test_a_month_name_that_shares_its_first_letters_is_still_a_printed_date():
    """June -> July differ after "Ju": the changed stretch is read as whole words, so Granite's "Today's Date:
    June 15, 2025." moved to July 20, 2026 is the clock's date (an intended exception), not a violation."""
    from runners.base import Rendered

    case = load_cases()[0]
    out = {("base", case.id): Rendered("Knowledge Cutoff Date: April 2024.\nToday's Date: June 15, 2025.\nHi"),
           ("clock", case.id): Rendered("Knowledge Cutoff Date: April 2024.\nToday's Date: July 20, 2026.\nHi")}
    record = props.time_invariance("{{ strftime_now('%B %d, %Y') }}", [case], out).record()
    assert record["status"] == "exception" and not record["violations"], record
    assert record["exceptions"][0]["kind"] == "reads-clock"
