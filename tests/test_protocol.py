"""The harness protocol: failure paths with deliberately broken harnesses, and schema validation of traffic."""
from __future__ import annotations

import io
import json
import os
import sys
import time

import pytest

from runners.base import Errored, Raised, RefusalKind, Rendered, RenderRequest, Skipped
from runners.command import CommandRunner
from runners.protocol import ProtocolError, encode, outcome_message, render_message
from runners.protocol import validate as protocol_validate

BROKEN = os.path.join(os.path.dirname(__file__), "harnesses", "broken.py")
HELLO = [{"role": "user", "content": "hi"}]


def broken(mode: str, **options) -> CommandRunner:
    return CommandRunner([sys.executable, BROKEN, mode], **options)


def run_three(runner: CommandRunner):
    """ok, BREAK, ok: the middle cell fails, the cells around it still render."""
    try:
        return [runner.render(RenderRequest.make(t, HELLO)) for t in ("before", "BREAK", "after")]
    finally:
        runner.close()


@pytest.mark.parametrize("mode, expected", [
    ("crash", "harness exited (exit code 3)"),
    ("badjson", "response is not JSON"),
    ("wrongseq", "expected seq 2, got 102"),
    ("badutf8", "not JSON"),
])
def test_a_broken_cell_is_errored_and_the_run_goes_on(mode, expected):
    runner = broken(mode, timeout=10)
    before, failed, after = run_three(runner)
    assert before == Rendered("before")
    assert isinstance(failed, Errored), failed
    assert expected in failed.message
    assert not failed.timed_out
    assert after == Rendered("after")  # a fresh process took over
    assert runner.restarts == 1


def test_crash_reports_the_stderr_tail():
    _, failed, _ = run_three(broken("crash", timeout=10))
    assert "about to crash on purpose" in failed.detail


def test_a_hang_times_out_and_the_run_goes_on():
    runner = broken("hang", timeout=1.0)
    started = time.monotonic()
    before, failed, after = run_three(runner)
    assert isinstance(failed, Errored) and failed.timed_out
    assert "no response within 1s" in failed.message
    assert (before, after) == (Rendered("before"), Rendered("after"))
    assert time.monotonic() - started < 15


def test_a_slow_start_is_errored_not_a_hang():
    import subprocess
    import uuid

    tag = uuid.uuid4().hex  # names this test's harness process only
    runner = CommandRunner([sys.executable, BROKEN, "slowstart", tag], timeout=5, start_timeout=1.0)
    try:
        outcome = runner.render(RenderRequest.make("x", HELLO))
    finally:
        runner.close()
    assert isinstance(outcome, Errored)
    # The harness that never answered start was killed, not left sleeping.
    leftover = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert leftover.strip() == "", leftover
    assert "failed to start" in outcome.message and "no response within 1s" in outcome.message


def test_a_missing_executable_is_errored():
    outcome = CommandRunner(["/nonexistent/harness-binary"]).render(RenderRequest.make("x", HELLO))
    assert isinstance(outcome, Errored) and "cannot start harness" in outcome.message


def test_validation_rejects_a_field_the_schema_does_not_allow():
    # Without validation the lenient reader takes the text; with it the cell is a protocol failure.
    assert run_three(broken("extrafield"))[1] == Rendered("x")
    before, failed, after = run_three(broken("extrafield", validate=True))
    assert isinstance(failed, Errored)
    assert "schema violation: render-response.schema.json" in failed.message
    assert (before, after) == (Rendered("before"), Rendered("after"))


def test_every_outcome_message_conforms_and_broken_ones_do_not():
    request = RenderRequest.make("t", HELLO, bos_token=None, eos_token="</s>", kwargs={"x": 1})
    protocol_validate.check("render", render_message(7, request))
    for outcome in (Rendered("a"), Raised("m"), Skipped("r"), Errored("e", "tail")):
        protocol_validate.check("render-response", outcome_message(7, outcome))
    bad = [
        {"seq": 7},                                          # no outcome
        {"seq": 7, "text": "a", "raised": {"message": "m"}},  # two outcomes
        {"seq": 0, "text": "a"},                             # seq starts at 1
        {"seq": 7, "raised": "m"},                           # body must be an object
        {"seq": 7, "skipped": {}},                           # reason required
    ]
    for message in bad:
        with pytest.raises(ProtocolError):
            protocol_validate.check("render-response", message)
    with pytest.raises(ProtocolError):
        protocol_validate.check("render", {k: v for k, v in render_message(1, request).items() if k != "now"})
    protocol_validate.check("start-response", {"name": "x", "version": "1"})
    with pytest.raises(ProtocolError):
        protocol_validate.check("start-response", {"version": "1"})


def test_wire_lines_are_ascii_single_lines():
    line = encode(render_message(1, RenderRequest.make("a\u2028b\n", [{"role": "user", "content": "\U0001F600"}])))
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    line.decode("ascii")
    assert json.loads(line)["template"] == "a\u2028b\n"


MINIMAL = os.path.join(os.path.dirname(os.path.dirname(__file__)), "runners", "examples", "minimal_harness.py")


def test_shell_validator_passes_a_conforming_harness_and_fails_a_broken_one():
    out = io.StringIO()
    result = protocol_validate.validate_harness([sys.executable, MINIMAL], out=out)
    assert result and result.protocol == 2 and not result.differences, out.getvalue()
    assert "conforms" in out.getvalue()
    out = io.StringIO()
    assert not protocol_validate.validate_harness([sys.executable, BROKEN, "slowstart"], start_timeout=1, out=out)
    assert "FAIL start" in out.getvalue()
    # broken.py "ok" answers every render with the template text: well-formed lines, but no template engine.
    out = io.StringIO()
    result = protocol_validate.validate_harness([sys.executable, BROKEN, "ok"], out=out)
    assert not result and result.protocol == 1
    assert "FAIL data-sensitivity" in out.getvalue() and "FAIL refusal-raise" in out.getvalue()


def test_shell_validator_command_line(tmp_path):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for command in (["-m", "runners.protocol.validate"], ["-m", "conformance.cli", "harness", "validate"]):
        result = subprocess.run([sys.executable, *command, "--timeout", "10", "--start-timeout", "30", "--",
                                 sys.executable, MINIMAL], cwd=root, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok   refusal-raise" in result.stdout


def test_every_probe_expects_what_the_reference_does(hf_renderer):
    """The probes' expected outcomes are the reference's, so a DIFF or FAIL is never the validator's mistake."""
    for probe in protocol_validate.probes():
        outcome = hf_renderer.render(probe.request)
        if probe.expected[0] == "rendered":
            assert outcome == Rendered(probe.expected[1]), probe.label
        else:
            assert isinstance(outcome, Raised) and str(outcome.refusal) == probe.expected[1], (probe.label, outcome)
            assert probe.expected[2] in outcome.message
    for label, request, expected in protocol_validate.sensitivity_probes():
        assert hf_renderer.render(request) == Rendered(expected), label
    assert len({hf_renderer.render(r) for r in protocol_validate.batch_probe()}) == 3


def test_bindings_on_the_wire_conform_to_the_schemas():
    from runners.protocol import batch_message

    requests = [RenderRequest.make("{{ messages }}", [{"role": "user", "content": None, "x": 1}]),
                RenderRequest.make("{{ messages }}", [{"role": "assistant", "content": "a"}], continue_final_message=True),
                RenderRequest.make("{{ messages }}", [], kwargs={"k": None})]
    for request in requests:
        protocol_validate.check("render", render_message(3, request, bindings=True))
    message = batch_message(3, requests, bindings=True)
    protocol_validate.check("batch", message)
    first, tagged, empty = (case["bindings"] for case in message["cases"])
    assert first["messages"] == [{"role": "user", "x": 1}] and first["tools"] is None
    assert tagged["refused"]["message"].startswith("ValueError: continue_final_message is set to \"content\"")
    assert empty["refused"] == {"message": "ValueError: Cannot apply chat template to an empty conversation. "
                                           "Provide at least one message.", "kind": "render", "before_compile": True}


def test_the_worked_exchange_in_protocol_md_conforms():
    path = os.path.join(os.path.dirname(protocol_validate.__file__), "PROTOCOL.md")
    with open(path, encoding="utf-8") as handle:
        block = handle.read().split("## Worked exchange")[1].split("```")[1]
    lines = block.strip().splitlines()
    assert len(lines) >= 7
    for line in lines:
        direction, message = line[0], json.loads(line[2:])
        if direction == ">":
            protocol_validate.check_request(message)
        else:
            protocol_validate.check("start-response" if "name" in message else "render-response", message)


WHOAMI = os.path.join(os.path.dirname(__file__), "harnesses", "whoami.py")


def _split(outcome):
    template, _, pid = outcome.text.rpartition("@")
    return template, int(pid)


def test_cells_of_one_template_stay_on_one_process_and_order_is_kept():
    requests = [RenderRequest.make(template=f"T{t}", messages=[{"role": "user", "content": str(c)}], case_id=str(c))
                for t in range(6) for c in range(10)]
    with CommandRunner([sys.executable, WHOAMI], workers=2) as runner:
        outcomes = list(runner.render_many(requests))
    assert [_split(o)[0] for o in outcomes] == [r.template for r in requests]
    pids_per_template = {}
    for outcome in outcomes:
        template, pid = _split(outcome)
        pids_per_template.setdefault(template, set()).add(pid)
    assert all(len(pids) == 1 for pids in pids_per_template.values()), pids_per_template
    assert len(set().union(*pids_per_template.values())) == 2  # both workers had templates


def test_a_single_template_batch_still_uses_every_worker():
    requests = [RenderRequest.make(template="T", messages=[{"role": "user", "content": str(c)}]) for c in range(10)]
    with CommandRunner([sys.executable, WHOAMI], workers=2) as runner:
        pids = [_split(o)[1] for o in runner.render_many(requests)]
    assert len(set(pids)) == 2 and pids[:5] == [pids[0]] * 5 and pids[5:] == [pids[5]] * 5


def test_a_consumer_that_stops_early_leaves_the_runner_usable():
    requests = [RenderRequest.make(template=f"T{t}", messages=[{"role": "user", "content": "x"}]) for t in range(40)]
    with CommandRunner([sys.executable, WHOAMI], workers=2) as runner:
        stream = runner.render_many(requests)
        assert _split(next(stream))[0] == "T0"
        stream.close()
        assert [_split(o)[0] for o in runner.render_many(requests[:4])] == ["T0", "T1", "T2", "T3"]


def test_a_batch_line_assembled_from_cached_conversations_is_the_encoded_batch_message():
    """encode_batch (each conversation's JSON encoded once per run) sends exactly the bytes of
    encode(batch_message(...)), with astral characters, lone surrogates and U+2028 in the data."""
    from runners.protocol import batch_message, encode_batch

    template = "{{ bos_token }}{% for m in messages %}{{ m.content }}\u2028{% endfor %}"
    requests = [RenderRequest.make(template, [{"role": "user", "content": text}], bos_token="<s>", eos_token=None,
                                   tools=[{"type": "function", "function": {"name": "f"}}] if i % 2 else None,
                                   kwargs={"enable_thinking": bool(i % 3)}, add_generation_prompt=True)
                for i, text in enumerate(["a", "\U0001F600", "lone \ud800", "line\u2028sep", "\x00"])]
    for _ in range(2):  # the second time from the cache
        assert encode_batch(7, requests) == encode(batch_message(7, requests))
    with pytest.raises(ValueError):
        encode_batch(1, [requests[0], RenderRequest.make("other", [])])


KEEPER = os.path.join(os.path.dirname(__file__), "harnesses", "keeper.py")


def _conversations(count: int) -> list:
    from runners.base import Conversation

    return [Conversation(messages=[{"role": "user", "content": f"c{c}"}]) for c in range(count)]


def _batches(log) -> list:
    """The cases of every batch the keeper received: "keep K", "ref K" or "full" each."""
    batches = []
    for line in log.read_bytes().splitlines():
        message = json.loads(line)
        if message.get("cmd") == "batch":
            batches.append([f"keep {c['keep']}" if "keep" in c else f"ref {c['ref']}" if "ref" in c else "full"
                            for c in message["cases"]])
    return batches


def test_a_keeping_harness_gets_each_conversation_once_and_answers_as_if_sent_in_full(tmp_path):
    """keep: the first batch sends each conversation in full with a number, later batches send the number, and the
    outcomes are exactly those of the same cells sent in full (the same harness offering to keep none)."""
    conversations = _conversations(3)  # one object each, as a case's: kept by object
    requests = [RenderRequest(f"T{t}", conversations[c]) for t in range(3) for c in range(3)]
    log = tmp_path / "kept.log"
    with CommandRunner([sys.executable, KEEPER, str(log), "100"], workers=1) as runner:
        kept = [o.text.rpartition("@")[0] for o in runner.render_many(requests)]
    assert _batches(log) == [["keep 0", "keep 1", "keep 2"], ["ref 0", "ref 1", "ref 2"], ["ref 0", "ref 1", "ref 2"]]
    with CommandRunner([sys.executable, KEEPER, str(tmp_path / "full.log"), "0"], workers=1) as runner:
        full = [o.text.rpartition("@")[0] for o in runner.render_many(requests)]
    assert _batches(tmp_path / "full.log") == [["full"] * 3] * 3
    assert kept == full == [f"T{t}:c{c}" for t in range(3) for c in range(3)]


def test_a_render_that_changes_its_conversation_leaves_the_kept_one_as_sent(tmp_path):
    """An engine handed live data may change it (a template's messages.pop()): the next template's cells still
    get each conversation exactly as chatgold sent it."""
    conversations = _conversations(2)
    requests = [RenderRequest(template, c) for template in ("MUTATE", "T") for c in conversations]
    with CommandRunner([sys.executable, KEEPER, str(tmp_path / "kept.log"), "8"], workers=1) as runner:
        texts = [o.text.rpartition("@")[0] for o in runner.render_many(requests)]
    assert _batches(tmp_path / "kept.log") == [["keep 0", "keep 1"], ["ref 0", "ref 1"]]
    assert texts == ["MUTATE:", "MUTATE:", "T:c0", "T:c1"]


def test_kept_conversations_stop_at_the_harness_limit_and_start_afresh_in_a_new_process(tmp_path):
    conversations = _conversations(3)
    cells = lambda template: [RenderRequest(template, c) for c in conversations]  # noqa: E731
    log = tmp_path / "kept.log"
    with CommandRunner([sys.executable, KEEPER, str(log), "2"], workers=1) as runner:
        first = list(runner.render_many(cells("A") + cells("B")))
        crashed = runner.render(RenderRequest("EXIT", conversations[0]))
        after = list(runner.render_many(cells("C")))
    assert _batches(log) == [["keep 0", "keep 1", "full"], ["ref 0", "ref 1", "full"],
                             ["keep 0", "keep 1", "full"]]  # the new process holds nothing: numbered afresh
    assert isinstance(crashed, Errored)
    assert [o.text.rpartition("@")[0] for o in first + after] == [f"{t}:c{c}" for t in "ABC" for c in range(3)]


def test_a_ref_the_process_does_not_hold_is_that_cell_errored_and_the_batch_goes_on():
    from runners.protocol import requests_from_batch

    message = {"cmd": "batch", "seq": 1, "template": "T", "bos_token": None, "eos_token": None,
               "cases": [{"ref": 5}, {"keep": 0, **RenderRequest.make("T", HELLO).conversation.to_dict()}]}
    kept: dict = {}
    cells = requests_from_batch(message, kept)
    assert isinstance(cells[0], Errored) and "no conversation kept as 5" in cells[0].message
    assert isinstance(cells[1], RenderRequest) and 0 in kept
    again = requests_from_batch({**message, "cases": [{"ref": 0}, {"ref": 0}]}, kept)
    assert again[0].conversation == again[1].conversation == cells[1].conversation
    assert again[0].conversation.messages is not again[1].conversation.messages  # fresh objects each time


def test_keep_on_the_wire_conforms_to_the_schemas_and_the_cached_encoding_is_the_message():
    from runners.protocol import KeptConversations, batch_message, encode_batch
    from runners.protocol.schema import check_request, check_response

    check_response("start-response", encode({"name": "e", "version": "1", "protocol": 2, "keep": 8}))
    from runners.base import Conversation

    requests = [RenderRequest("T", Conversation(messages=[{"role": "user", "content": text}]))
                for text in ("a", "\U0001F600", "c")]
    fast, slow = KeptConversations(2), KeptConversations(2)
    for _ in range(2):  # kept, then by reference; the third conversation is past the limit both times
        line = encode_batch(4, requests, kept=fast)
        message = batch_message(4, requests, kept=slow)
        assert line == encode(message)
        check_request(message)
    assert [sorted(case)[:1] for case in message["cases"]] == [["ref"], ["ref"], ["add_generation_prompt"]]
    with pytest.raises(ProtocolError):
        check_request({**message, "cases": [{"ref": 0, "messages": []}]})


def test_the_validator_checks_keep_and_fails_a_harness_that_forgets(tmp_path):
    out = io.StringIO()
    result = protocol_validate.validate_harness([sys.executable, KEEPER, str(tmp_path / "a.log"), "16"], out=out)
    assert "ok   keep" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    forgetful = tmp_path / "forgetful.py"
    forgetful.write_text(FORGETFUL.replace("KEEPER", repr(KEEPER)))
    result = protocol_validate.validate_harness([sys.executable, str(forgetful), str(tmp_path / "b.log"), "16"],
                                                out=out)
    assert not result and "FAIL keep" in out.getvalue(), out.getvalue()
    assert "sent by reference answered" in out.getvalue() and "errored" not in out.getvalue().split("FAIL keep")[1]


# The keeper with a bug: a conversation sent by reference is rendered as an empty one.
FORGETFUL = '''
import marshal, runpy, sys
import runners.protocol as protocol
plain = protocol.requests_from_batch
def forgetting(message, kept=None, fresh=True):
    for case in message["cases"]:
        if "ref" in case and kept is not None:
            kept[case["ref"]] = marshal.dumps({"messages": []})
    return plain(message, kept, fresh)
protocol.requests_from_batch = forgetting
sys.argv = [KEEPER] + sys.argv[1:]
runpy.run_path(KEEPER, run_name="__main__")
'''


def test_a_rendered_answer_encoded_directly_is_the_encoded_outcome_message():
    """encode_outcome's fast path for a rendered text gives exactly encode(outcome_message(...)), astral characters,
    lone surrogates, U+2028 and control characters included; other outcomes take the general path."""
    from runners.protocol import encode_outcome

    for text in ("", "plain", "\U0001F600 astral", "lone \ud800", "line\u2028sep", "\x00\n\t\"\\"):
        assert encode_outcome(7, Rendered(text)) == encode(outcome_message(7, Rendered(text)))
    for outcome in (Raised("TypeError: x", RefusalKind.RENDER), Skipped("no"), Errored("boom", "tail", True)):
        assert encode_outcome(3, outcome) == encode(outcome_message(3, outcome))
    assert encode_outcome(3, Raised("m", RefusalKind.RAISE), version=1) == \
        encode(outcome_message(3, Raised("m", RefusalKind.RAISE), 1))


def test_a_harness_answer_line_is_one_utf8_line_the_client_reads_as_the_outcome():
    """answer_line (what chatgold's own harnesses write) may carry UTF-8 unescaped; the client reads back the same
    outcome, and a text UTF-8 cannot carry (a lone surrogate) goes as ASCII escapes, as encode_outcome gives."""
    from runners.command import _parse_line
    from runners.protocol import answer_line, encode_outcome, outcome_from_message

    outcomes = [Rendered(text) for text in ("", "plain", "\U0001F600 astral", "line\u2028sep", "\x00\n\t\"\\",
                                            "caf\u00e9 \u4e2d")]
    outcomes += [Raised("TypeError: \u00e9", RefusalKind.RENDER), Raised("m", RefusalKind.RAISE), Skipped("no"),
                 Errored("boom", "tail\n", True)]
    for seq, outcome in enumerate(outcomes):
        line = answer_line(seq, outcome)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        line.decode("utf-8")
        assert outcome_from_message(_parse_line(line), seq) == outcome
    surrogate = Rendered("lone \ud800")
    assert answer_line(2, surrogate) == encode_outcome(2, surrogate)
    assert outcome_from_message(_parse_line(answer_line(2, surrogate)), 2) == surrogate


HOLDER = os.path.join(os.path.dirname(__file__), "harnesses", "holder.py")


@pytest.mark.parametrize("failure, timed_out", [("HANG", True), ("CRASH", False)])
def test_a_failure_inside_a_held_batch_costs_only_its_own_cell(failure, timed_out):
    """A harness that holds a batch's answers has rendered the cells before the failing one without writing
    them: the failure is placed by sending the unanswered cells again one at a time, so those cells render and
    only the failing one is errored (not the first unanswered, which would be a false verdict)."""
    contents = ["a", "b", "c", failure, "d", "e"]
    runner = CommandRunner([sys.executable, HOLDER], timeout=2.0)
    try:
        outcomes = list(runner.render_many([RenderRequest.make("t", [{"role": "user", "content": c}])
                                            for c in contents]))
        assert runner.start_answer.get("hold") is True
    finally:
        runner.close()
    failed = outcomes[3]
    assert isinstance(failed, Errored) and failed.timed_out is timed_out, failed
    assert [o for i, o in enumerate(outcomes) if i != 3] == [Rendered(c) for c in "abcde"]


def test_a_version_1_start_offers_no_hold():
    from runners.protocol import harness_description

    assert "hold" not in harness_description({"name": "x", "version": "1"}, 1, hold=True)
    assert harness_description({"name": "x", "version": "1"}, 2, hold=True)["hold"] is True
