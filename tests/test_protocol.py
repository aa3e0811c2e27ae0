"""The harness protocol: failure paths with deliberately broken harnesses, and schema validation of traffic."""
from __future__ import annotations

import io
import json
import os
import sys
import time

import pytest

from runners.base import Errored, Raised, Rendered, RenderRequest, Skipped
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
