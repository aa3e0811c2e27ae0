"""`chatgold expectations minimize` (conformance/explain/finish.py): a stored reproducer that a single step of the
reducer still shrinks is finished to 1-minimal, and causes that are then one mechanism become one cause with all
their cells and reasons. Real MiniJinja and the real reference."""
from __future__ import annotations

import pytest

from conformance.explain.finish import finish_baseline
from conformance.explain.minimal import is_one_minimal
from conformance.judge.expectations import Expectations, KnownCause, parse_value
from runners import get_runner

# MiniJinja's `tojson` escapes `'` as `\u0027` (its baseline's cause, 1-minimal as recorded).
MINIMAL = {"template": "{{ tools|tojson }}",
           "case": {"messages": [{"role": ""}], "tools": [{"function": {"description": "'"}}]},
           "bos_token": None, "eos_token": "<|endoftext|>"}
# The same bug inside templates an older reducer might have stopped at: other constructs, more data.
BLOATED = [
    {**MINIMAL, "template": "{%- set greeting = 'Hello' | upper -%}\n{{ greeting }}\n{{ tools|tojson }}\n"
                            "{%- for m in messages %}[{{ m.role }}]{% endfor %}",
     "case": {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
              "tools": [{"function": {"description": "it's", "name": "f"}}]}},
    {**MINIMAL, "template": "{% if messages | length > 0 %}<tools>{{ tools|tojson }}</tools>{% endif %}\n"
                            "{{ 'x' ~ 'y' }}",
     "case": {"messages": [{"role": "system", "content": "s"}], "tools": [{"function": {"description": "'"}},
                                                                        {"type": "function"}]}},
]


@pytest.fixture(scope="module")
def runners():
    with get_runner("hf") as reference, get_runner("minijinja") as engine:
        yield reference, engine


def _baseline(repros: dict) -> Expectations:
    causes = {cause_id: KnownCause(cause_id, "old title", f"reason of {cause_id}", "", [], None, repro)
              for cause_id, repro in repros.items()}
    cells = {f"t-{cause_id}": {"chat-single-user": f"diverged:00ff@{cause_id}", "chat-multi-turn": "diverged:11ee"}
             for cause_id in repros}
    return Expectations("minijinja", cells, causes=causes)


def test_bloated_reproducers_of_one_bug_finish_to_one_minimal_cause(runners):
    reference, engine = runners
    alone, _, _ = finish_baseline(_baseline({"c-minimal": MINIMAL}), engine, reference)
    (expected_id,) = alone.causes
    new, counts, finished = finish_baseline(_baseline({"c-a": BLOATED[0], "c-b": BLOATED[1]}), engine, reference)
    assert all(f.record is not None and f.steps for f in finished), [f.kept_because for f in finished]
    assert list(new.causes) == [expected_id], "two reproducers of one bug are one cause, keyed as the minimal one"
    assert counts == {"causes_before": 2, "causes_after": 1, "reduced": 2, "renamed": 2, "merged": 1, "kept": 0}
    cause = new.causes[expected_id]
    assert is_one_minimal(cause.repro, engine, reference)
    assert cause.repro["template"].count("\n") == 0 and "upper" not in cause.repro["template"]
    assert "reason of c-a" in cause.reason and "reason of c-b" in cause.reason
    assert "tojson" in cause.title and cause.title != "old title"
    # every cell that named an old cause names the merged one; cells without a cause are untouched
    named = [parse_value(v) for cases in new.cells.values() for v in cases.values()]
    assert sorted(c for _, _, c in named if c) == [expected_id, expected_id]
    assert sum(1 for _, _, c in named if c is None) == 2


def test_a_reproducer_that_no_longer_differs_is_kept_as_recorded(runners):
    reference, engine = runners
    agrees = {**MINIMAL, "template": "{{ messages[0].role }}"}
    new, counts, finished = finish_baseline(_baseline({"c-gone": agrees}), engine, reference)
    assert list(new.causes) == ["c-gone"] and counts["kept"] == 1
    assert "does not differ" in finished[0].kept_because


def test_an_engine_keying_templates_by_their_text_keeps_its_causes_with_template_steps_on():
    """paperkiln resolves its record by the sha256 of the exact template text. Finished with template steps on
    (no --data-only), its stored causes keep their ids and titles: the finisher tells an engine that keys the
    template by its text as a reduction does (the neutral variant), not only one that ignores any template."""
    import json
    from pathlib import Path

    from conformance.judge.expectations import load_expectations

    folder = Path(__file__).resolve().parent.parent / "conformance" / "expectations"
    baseline = load_expectations("paperkiln", folder)
    stored = json.loads((folder / "paperkiln.json").read_text())["causes"]
    with get_runner("hf", workers=2) as reference, get_runner("paperkiln", workers=2) as engine:
        new, counts, finished = finish_baseline(baseline, engine, reference)
    assert counts["kept"] == 0 and counts["reduced"] == 0, [f.kept_because for f in finished]
    assert counts["renamed"] == 0, [(f.old_id, f.record.id, f.record.title) for f in finished]
    assert {c["id"]: c["title"] for c in stored} == {c.id: c.title for c in new.causes.values()}
    assert all("ignores the template" in c.title for c in new.causes.values())
    # each record it resolves is a format of its own: a cause is named by the text that picked it
    from conformance.explain import cluster
    assert all(cluster.text_identity(c.repro["template"]) in c.title for c in new.causes.values())
