"""Verdicts the reader can trust: a protocol-1 refusal that repeats the reference's is the same refusal, every
worker of a version-1 harness negotiates version 1, an errored cell is never silently outside an explanation,
and `chatgold check` and `chatgold explain` agree on which cells fail. All with a real protocol-1 harness
(tests/harnesses/protocol1.py: plain jinja2 with SEMANTICS.md's rules) on real corpus templates."""
from __future__ import annotations

import gzip
import json
import shlex
import sys
import threading
from pathlib import Path

import pytest

from conformance import schema_validator
from conformance.checkrun import check_cells
from conformance.explain import explain
from conformance.judge.classify import classify
from conformance.judge.goldens import Golden
from conformance.judge.pipeline import GoldenJudge, Selection, requests_by_cell
from conformance.judge.status import Status
from runners import get_runner
from runners.base import Raised, RefusalKind, RenderRequest, Rendered

HARNESS = Path(__file__).parent / "harnesses" / "protocol1.py"
sys.path.insert(0, str(HARNESS.parent))
from protocol1 import ERRORED  # noqa: E402

# Templates on which the reference refuses many cells, for every reason it has: a type error
# (`can only concatenate str (not "list") to str`), an undefined value, raise_exception, SecurityError, a
# continue_final_message refusal quoting the rendered chat, and `dict.from_keys`.
REFUSING = ["unsloth-llama", "tencent-hunyuan-7b-pretrain-0124", "alpindale-llama-guard-3-1b",
            "deepseek-ai-deepseek-v3.2", "adamaja111-legal-qwen2.5-1.5b-ft", "ai-sage-gigachat3.1-audio-10b-a1.8b"]


def protocol1(*args, workers: int = 2):
    argv = [sys.executable, str(HARNESS), *args]
    return get_runner("command:" + shlex.join(argv), workers=workers, timeout=20)


@pytest.fixture(scope="module")
def reference():
    runner = get_runner("hf", workers=2)
    yield runner
    runner.close()


# -- the rule -------------------------------------------------------------------------------------------------

CONCAT = 'TypeError: can only concatenate str (not "list") to str'


@pytest.mark.parametrize("message, status", [
    (CONCAT, Status.BOTH_RAISED),                                       # the reference's refusal, whole
    ('can only concatenate str (not "list") to str', Status.BOTH_RAISED),  # without its exception type
    ('ValueError: can only concatenate str (not "list") to str', Status.RAISED_DIFFERENTLY),  # another type
    (CONCAT + " ", Status.RAISED_DIFFERENTLY),                          # nothing is normalised
    (CONCAT.lower(), Status.RAISED_DIFFERENTLY),
    ("can only concatenate str", Status.RAISED_DIFFERENTLY),            # a part is not the message
    (f"{CONCAT} (in chat_template:3)", Status.RAISED_DIFFERENTLY),
    ("TypeError", Status.RAISED_DIFFERENTLY),
    ("", Status.RAISED_DIFFERENTLY),
])
def test_a_refusal_of_unknown_kind_matches_only_the_reference_message_exactly(message, status):
    golden = Golden("raised", CONCAT.encode())
    assert classify(golden, Raised(message, RefusalKind.UNKNOWN)).status == status


def test_the_unknown_kind_rule_leaves_other_cells_as_they_were():
    # raise_exception(M): a message carrying M still matches, whatever else it says
    raised = Golden("raised", b"TemplateError: Only user roles!")
    assert classify(raised, Raised("Error: Only user roles! (line 1)")).status == Status.BOTH_RAISED
    assert classify(raised, Raised("Only users!")).status == Status.RAISED_DIFFERENTLY
    # an empty reference message vouches for nothing
    assert classify(Golden("raised", b"ValueError: "), Raised("")).status == Status.RAISED_DIFFERENTLY
    # a refusal where the reference rendered is engine-raised, whatever its message
    assert classify(Golden("rendered", CONCAT.encode()), Raised(CONCAT)).status == Status.ENGINE_RAISED
    # protocol 2: the kind decides, as before (a message equal to the reference's does not make up for it)
    golden = Golden("raised", CONCAT.encode())
    assert classify(golden, Raised("whatever", RefusalKind.RENDER)).status == Status.BOTH_RAISED
    assert classify(golden, Raised(CONCAT, RefusalKind.COMPILE)).status == Status.RAISED_DIFFERENTLY
    assert classify(golden, Raised(CONCAT, RefusalKind.UNSUPPORTED)).status == Status.RAISED_DIFFERENTLY


# -- a faithful protocol-1 harness ------------------------------------------------------------------------------

@pytest.mark.parametrize("bare", [False, True], ids=["whole", "bare"])
def test_a_faithful_protocol1_harness_gets_100_percent_and_no_cause(bare, reference):
    cells = Selection.load(REFUSING, []).cells()
    with protocol1(*(["--bare"] if bare else [])) as runner:
        results = check_cells(runner, cells, GoldenJudge())
        assert runner.protocol == 1
        explanation = explain(results, runner, reference, requests_by_cell(cells))
    refused = [r for r in results.results if r.golden_kind == "raised"]
    assert results.counts()["both-raised"] == len(refused) >= 150
    # the reference refuses for every reason it has here: the engine's message is the reference's each time
    assert {r.reference_message.partition(":")[0] for r in refused} == \
        {"TypeError", "UndefinedError", "TemplateError", "SecurityError", "ValueError", "TemplateRuntimeError"}
    assert results.figure()["conformance"] == 100.0, [(r.key, r.status, r.message[:80]) for r in results.results
                                                     if not r.passed][:5]
    assert explanation.causes == [] and explanation.unexplained == [] and explanation.stats["cells"] == 0


# -- the version-1 downgrade race -------------------------------------------------------------------------------

def test_every_worker_of_a_version1_harness_negotiates_version1():
    """Every worker starts at once (a slow start keeps them waiting together): each one's refusal of version 2
    must lead to a start with version 1, not to a failure because another worker already lowered the version."""
    requests = [RenderRequest.make(f"{{{{ messages[0].content }}}} {n}", [{"role": "user", "content": "hi"}])
                for n in range(16)]
    with protocol1("--slow-start", "0.3", workers=4) as runner:
        outcomes = list(runner.render_many(requests))
        assert runner.protocol == 1 and runner.given_up is None
    assert [o for o in outcomes if not isinstance(o, Rendered)] == []
    assert [o.text for o in outcomes] == [f"hi {n}" for n in range(16)]

    # renders from several threads at once on a fresh runner: the same
    with protocol1("--slow-start", "0.3", workers=3) as runner:
        answers: dict = {}
        threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, runner.render(requests[n])))
                   for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert runner.protocol == 1
    assert {n: a for n, a in answers.items() if not isinstance(a, Rendered)} == {}


# -- errored cells in an explanation ----------------------------------------------------------------------------

def test_errored_cells_are_counted_and_shown_unexplained_with_their_message(reference, tmp_path, capsys):
    from conformance.cli.explain import describe_causes
    from conformance.report import build_report, check_report, write_outputs

    selection = Selection.load(["meta-llama-llama-3.1-8b-instruct"],
                               ["chat-single-user", "documents-rag", "documents-rag-system-unicode", "tools-one"])
    cells = selection.cells()
    with protocol1("--errored-on-documents", "--bug", "tojson-sorts-keys") as runner:
        results = check_cells(runner, cells, GoldenJudge())
        explanation = explain(results, runner, reference, requests_by_cell(cells))
    errored = {r.key for r in results.results if r.status == Status.ERRORED}
    assert errored == {("meta-llama-llama-3.1-8b-instruct", "documents-rag"),
                       ("meta-llama-llama-3.1-8b-instruct", "documents-rag-system-unicode")}
    assert len(explanation.causes) == 1   # the tojson bug, on tools-one
    listed = {(u["template"], u["case"]): u for u in explanation.unexplained}
    assert set(listed) == errored
    for entry in listed.values():
        assert entry["status"] == "errored" and ERRORED in entry["reason"]
    assert explanation.stats["no_answer"] == 2 and explanation.stats["cells"] == 3
    assert explanation.stats["unexplained"] == 2

    terminal = describe_causes(explanation)
    assert "2 unexplained (2 errored or timed out)" in terminal and ERRORED in terminal
    data = explanation.to_dict()
    schema_validator("explain.schema.json").validate(data)
    assert sum(ERRORED in u["reason"] for u in data["unexplained"]) == 2

    results.explanation = explanation
    report = build_report([results], selection.describe(), selection.metadata())
    check_report(report)   # every failing cell under one cause or unexplained
    [html] = write_outputs(report, html_path=tmp_path / "r.html")
    text = Path(html).read_text()
    assert "1 root cause(s)" in text and "2 cell(s) unexplained" in text
    assert f"<li>2: the engine errored, so there is no difference to explain: {ERRORED}</li>" in text


# -- check and explain agree ------------------------------------------------------------------------------------

def test_check_and_explain_agree_on_the_failing_cells(tmp_path, capsys):
    """The same selection through `chatgold check` and `chatgold explain` (a protocol-1 harness with a planted
    bug that also errors on documents): the cells check counts as failing are exactly the cells explain puts
    under a cause or lists unexplained."""
    from conformance.cli import main

    harness = "command:" + shlex.join([sys.executable, str(HARNESS), "--bug", "tojson-sorts-keys",
                                       "--errored-on-documents"])
    selection = ["--template", "meta-llama-llama-3.1-8b-instruct",
                 "--template", "adamaja111-legal-qwen2.5-1.5b-ft", "--workers", "2",
                 "--expectations", str(tmp_path / "expectations")]
    assert main(["check", "--runner", harness, *selection, "--no-explain", "--json", str(tmp_path / "check.json")]) == 1
    assert main(["explain", "--runner", harness, *selection, "--no-cache",
                 "--json", str(tmp_path / "explain.json")]) == 0
    capsys.readouterr()
    with gzip.open(tmp_path / "check.cells.jsonl.gz", "rt") as lines:
        records = [json.loads(line) for line in lines]
    failing = {(r["template"], r["case"]) for r in records
               if Status(r["status"]).judged and not Status(r["status"]).passed}
    data = json.loads((tmp_path / "explain.json").read_text())
    explained = [tuple(cell) for cause in data["causes"] for cell in cause["cells"]]
    explained += [(u["template"], u["case"]) for u in data["unexplained"]]
    assert len(explained) == len(set(explained)), "a cell under two causes"
    assert set(explained) == failing
    assert data["stats"]["cells"] == len(failing)

    statuses = {r["status"] for r in records if (r["template"], r["case"]) in failing}
    assert statuses == {"diverged", "errored"}   # the harness refuses as the reference does
    assert len(failing) >= 10
