"""The llama.cpp runner against a real llama-server (built from the pinned source, cached under ~/.cache).

CI builds the server before the tests (`chatgold engines build llama.cpp`); on a developer machine the
session fixture builds it on first use (minutes, once).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from runners.base import Errored, Raised, RefusalKind, Rendered, RenderRequest
from runners.hf import HFRenderer
from runners.llamacpp import LlamaCppRunner, build, build_llama_server
from runners.llamacpp.model import model_for
from runners.llamacpp.runner import START_ATTEMPTS

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_BOS, LLAMA3_EOS = "<|begin_of_text|>", "<|eot_id|>"

CHATS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "  What is 2+2?\n"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey — ünïcödé ✓"}], False),
]

# Hangs only when asked to (the server renders the template once at start-up, with no kwargs).
HANG_ON_REQUEST = ("{% if hang %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                   "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.fixture(scope="session")
def llama_server_binary():
    return build_llama_server()


@pytest.fixture(scope="module")
def runner(llama_server_binary):
    with LlamaCppRunner(timeout=20.0, workers=2) as r:
        yield r


def req(template, messages, bos=None, eos=None, agp=False, **extra):
    return RenderRequest.make(template=template, messages=messages, bos_token=bos, eos_token=eos,
                         add_generation_prompt=agp, **extra)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.parametrize("template,bos,eos", [(CHATML, None, "<|im_end|>"), (LLAMA3, LLAMA3_BOS, LLAMA3_EOS)],
                         ids=["chatml", "llama3"])
def test_renders_byte_exact_to_the_reference(runner, template, bos, eos):
    reference = HFRenderer()
    requests = [req(template, messages, bos, eos, agp) for messages, agp in CHATS]
    outcomes = list(runner.render_many(requests))
    for request, outcome in zip(requests, outcomes):
        expected = reference.render(request)
        assert isinstance(expected, Rendered)
        assert outcome == Rendered(expected.text)
    if bos:
        assert outcomes[0].text.startswith(bos)  # not stripped: the GGUF says add_bos_token=false


def test_missing_bos_renders_as_empty_string(runner):
    outcome = runner.render(req("[{{ bos_token }}|{{ eos_token }}]{{ messages[0].content }}",
                                [{"role": "user", "content": "x"}], None, "</s>"))
    assert outcome == Rendered("[|</s>]x")


def test_raise_exception_is_raised_with_its_message(runner):
    template = ("{% if messages[-1].content == 'forbidden' %}{{ raise_exception('Forbidden content') }}{% endif %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    outcome = runner.render(req(template, [{"role": "user", "content": "forbidden"}]))
    assert isinstance(outcome, Raised), outcome
    assert "Forbidden content" in outcome.message
    assert runner.render(req(template, [{"role": "user", "content": "u"}])) == Rendered("u")


def test_known_difference_system_merged_where_template_has_no_system_role(runner):
    # docs/llamacpp.md: llama.cpp folds the system message into the next one instead of showing it to the
    # template; the reference lets the template see (and here refuse) the system role.
    template = ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    request = req(template, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert isinstance(HFRenderer().render(request), Raised)
    assert runner.render(request) == Rendered("user:s\nu;")


def test_template_the_server_refuses_at_start_raises_for_every_cell(runner):
    template = "{{ raise_exception('this template always refuses') }}"
    outcomes = list(runner.render_many([req(template, [{"role": "user", "content": str(i)}]) for i in range(3)]))
    for outcome in outcomes:
        assert isinstance(outcome, Raised), outcome
        assert "always refuses" in outcome.message


def test_clock_is_frozen_per_case(runner):
    assert runner.clock_status() is None
    template = "{{ strftime_now('%Y-%m-%d %H:%M:%S %A') }}|{{ messages[0].content }}"
    chat = [{"role": "user", "content": "x"}]
    nows = ["2024-02-29T23:59:58+00:00", "2031-12-31T10:00:00-05:00", "2024-02-29T23:59:58+00:00"]
    outcomes = list(runner.render_many([req(template, chat, now=now) for now in nows]))
    assert outcomes == [Rendered("2024-02-29 23:59:58 Thursday|x"), Rendered("2031-12-31 15:00:00 Wednesday|x"),
                        Rendered("2024-02-29 23:59:58 Thursday|x")]
    reference = HFRenderer().render(req(template, chat, now=nows[1]))
    assert reference == outcomes[1]


def test_hanging_request_times_out_and_the_run_goes_on(llama_server_binary):
    with LlamaCppRunner(timeout=1.5, workers=1) as quick:
        chat = [{"role": "user", "content": "ok"}]
        started = time.monotonic()
        outcomes = list(quick.render_many([req(HANG_ON_REQUEST, chat, kwargs={"hang": True}),
                                           req(HANG_ON_REQUEST, chat)]))
        assert time.monotonic() - started < 15
        assert isinstance(outcomes[0], Errored) and outcomes[0].timed_out, outcomes[0]
        assert outcomes[1] == Rendered("ok")
        assert quick.restarts == 1


def test_server_killed_mid_run_costs_one_cell(llama_server_binary):
    slow = ("{% if slow %}{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}{% endif %}"
            "{% for m in messages %}{{ m.content }}{% endfor %}")
    with LlamaCppRunner(timeout=60, workers=1) as r:
        chat = [{"role": "user", "content": "after"}]
        assert r.render(req(slow, chat)) == Rendered("after")  # server up and idle
        killed = []

        def kill_busy_server():
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not killed:
                for server in list(r._busy):
                    os.kill(server.proc.pid, signal.SIGKILL)
                    killed.append(server.proc.pid)
                time.sleep(0.01)

        killer = threading.Thread(target=kill_busy_server)
        killer.start()
        outcomes = list(r.render_many([req(slow, chat, kwargs={"slow": True})] + [req(slow, chat)] * 3))
        killer.join()
        assert killed, "the slow render finished before it could be killed"
        assert isinstance(outcomes[0], Errored) and not outcomes[0].timed_out, outcomes[0]
        assert "SIGKILL" in outcomes[0].message
        assert outcomes[1:] == [Rendered("after")] * 3


def test_render_many_keeps_order_across_templates(runner):
    templates = [f"T{n}:{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}" for n in range(4)]
    requests = [req(templates[i % 4], [{"role": "user", "content": str(i)}]) for i in range(12)]
    assert list(runner.render_many(requests)) == [Rendered(f"T{i % 4}:{i}") for i in range(12)]


def test_inputs_reach_the_template(runner):
    template = ("{{ tools | length }}|{{ documents[0].title }}|{{ flavour }}|"
                "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
                "{% if add_generation_prompt %}GEN{% endif %}")
    request = req(template, [{"role": "user", "content": "u"}], agp=True,
                  tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                  documents=[{"title": "Doc", "text": "body"}], kwargs={"flavour": "mint"})
    assert runner.render(request) == Rendered("1|Doc|mint|user=u;GEN")


def test_close_leaves_no_process(llama_server_binary):
    r = LlamaCppRunner(workers=2)
    list(r.render_many([req(CHATML, [{"role": "user", "content": "a"}]),
                        req(LLAMA3, [{"role": "user", "content": "b"}], LLAMA3_BOS, LLAMA3_EOS)]))
    r.render(req(CHATML, [{"role": "user", "content": "kept idle"}]))
    pids = [s.proc.pid for group in r._idle.values() for s in group]
    assert pids, "expected an idle server to be kept for reuse"
    assert all(_alive(pid) for pid in pids)
    r.close()
    assert not any(_alive(pid) for pid in pids)
    r.close()  # twice is fine


def test_request_body_and_outcome_mapping():
    request = req(CHATML, [{"role": "user", "content": "x"}], continue_final_message=True)
    body = LlamaCppRunner.request_body(request)
    assert body == {"messages": request.messages, "add_generation_prompt": False, "chat_template_kwargs": {},
                    "continue_final_message": True}
    with_docs = LlamaCppRunner.request_body(req(CHATML, [], tools=[], documents=[{"text": "d"}], kwargs={"k": 1}))
    assert with_docs["chat_template_kwargs"] == {"k": 1, "documents": [{"text": "d"}]} and with_docs["tools"] == []
    with pytest.raises(Exception, match="documents"):
        LlamaCppRunner.request_body(req(CHATML, [], documents=[], kwargs={"documents": []}))
    assert LlamaCppRunner.outcome(200, {"prompt": "p"}) == Rendered("p")
    assert LlamaCppRunner.outcome(400, {"error": {"code": 400, "message": "bad"}}) == Raised("bad", RefusalKind.RENDER)
    raised = LlamaCppRunner.outcome(500, {"error": {"code": 500, "message": "Jinja Exception: Only user roles"}})
    assert raised == Raised("Jinja Exception: Only user roles", RefusalKind.RAISE)
    assert isinstance(LlamaCppRunner.outcome(502, {"what": 1}), Errored)


def test_gguf_is_cached_by_content(tmp_path):
    first = model_for(CHATML, None, "<|im_end|>", tmp_path)
    again = model_for(CHATML, None, "<|im_end|>", tmp_path)
    other = model_for(CHATML, "<s>", "<|im_end|>", tmp_path)
    assert first == again and first != other
    assert first.read_bytes()[:4] == b"GGUF"
    assert len(list(tmp_path.glob("*.gguf"))) == 2


def test_bad_source_archive_is_refused_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGOLD_CACHE", str(tmp_path))
    download_dir = tmp_path / "dl" / f"{build.SDIST_NAME}-{build.SDIST_VERSION}"
    download_dir.mkdir(parents=True)
    (download_dir / build.SDIST_FILENAME).write_bytes(b"not the release")
    with pytest.raises(build.LlamaCppBuildError, match="sha256"):
        build.build_llama_server()
    assert not (download_dir / build.SDIST_FILENAME).exists()  # moved aside, refetched next time
    assert not build.install_dir().exists()
    assert build.install_dir() == tmp_path / f"llama.cpp-{build.LLAMA_CPP_TAG}"


CHILD = r"""
import signal, sys, time
# As in a terminal: a parent started in the background (nohup, `cmd &` in a script) hands down SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from runners.base import RenderRequest
from runners.llamacpp import LlamaCppRunner
r = LlamaCppRunner()
out = r.render(RenderRequest.make(template="{{ messages[0].content }}", messages=[{"role": "user", "content": "hi"}]))
assert out.text == "hi", out
print(" ".join(str(s.proc.pid) for group in r._idle.values() for s in group), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_servers_stop_when_the_process_is_signalled(llama_server_binary, signum):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, cwd=root,
                             env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        line = child.stdout.readline().decode()
        pids = [int(p) for p in line.split()]
        assert pids and all(_alive(pid) for pid in pids), line
        child.send_signal(signum)
        child.wait(timeout=20)
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids)
    finally:
        child.kill()
        child.wait()


def test_cli_engines_build_reports_the_cached_binary(llama_server_binary, capsys):
    from conformance.cli import main

    assert main(["engines", "build", "llama.cpp"]) == 0
    assert capsys.readouterr().out.strip() == str(llama_server_binary)


def _preloads(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
    return env.get(b"LD_PRELOAD", b"").decode()


def test_only_clock_reading_templates_get_libfaketime_and_every_server_gets_mimalloc(runner):
    plain = req("P:{% for m in messages %}{{ m.content }}{% endfor %}", [{"role": "user", "content": "x"}])
    clocked = req("C:{{ strftime_now('%Y') }}", [{"role": "user", "content": "x"}])
    seen = {}
    for request in (plain, clocked):
        server = runner._acquire(("probe", request.template), request)
        try:
            seen[request.template[0]] = (_preloads(server.proc.pid), server.frozen_clock)
        finally:
            runner._release(("probe", request.template), server, keep=False)
    assert "faketime" not in seen["P"][0] and seen["P"][1] is False
    assert "faketime" in seen["C"][0] and seen["C"][1] is True
    assert all("mimalloc" in preload for preload, _ in seen.values())
    assert runner.describe()["allocator"].startswith("mimalloc")
    assert runner.render(clocked) == Rendered("C:2025")


def test_system_allocator_renders_the_same(llama_server_binary, monkeypatch):
    from runners.llamacpp import allocator

    requests = [req(LLAMA3, CHATS[0], bos=LLAMA3_BOS, eos=LLAMA3_EOS, agp=True), req(CHATML, CHATS[1])]
    with LlamaCppRunner(workers=1) as with_mimalloc:
        expected = list(with_mimalloc.render_many(requests))
    allocator.find_mimalloc.cache_clear()
    monkeypatch.setenv("CHATGOLD_LLAMACPP_MALLOC", "system")
    try:
        with LlamaCppRunner(workers=1) as with_glibc:
            assert with_glibc.describe()["allocator"] == "glibc malloc"
            assert list(with_glibc.render_many(requests)) == expected
    finally:
        allocator.find_mimalloc.cache_clear()


def test_a_start_that_logs_no_reason_is_started_again(llama_server_binary, tmp_path):
    """llama.cpp's logger is not flushed at exit, so a refusing server under load can exit with code 1 and no
    error in its log (seen in CI). The first start here exits that way; the next is the real server, whose
    refusal is then reported as the template's, not as an engine error."""
    marker = tmp_path / "started-once"
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f"#!/bin/sh\nif [ ! -e '{marker}' ]; then : > '{marker}'; "
                       f"echo 'srv    load_model: initializing'; exit 1; fi\nexec '{llama_server_binary}' \"$@\"\n")
    wrapper.chmod(0o755)
    template = "{{ raise_exception('this template always refuses') }}"
    with LlamaCppRunner(timeout=20.0, workers=1) as flaky:
        flaky._binary = wrapper
        outcome = flaky.render(req(template, [{"role": "user", "content": "u"}]))
        assert isinstance(outcome, Raised) and "always refuses" in outcome.message, outcome
        assert marker.exists() and flaky.lost_start_reasons == 1


def test_a_start_that_never_logs_a_reason_is_an_engine_error_after_bounded_tries(tmp_path):
    wrapper = tmp_path / "llama-server"
    count = tmp_path / "starts"
    wrapper.write_text(f"#!/bin/sh\necho x >> '{count}'\necho 'srv    load_model: initializing'\nexit 1\n")
    wrapper.chmod(0o755)
    with LlamaCppRunner(timeout=5.0, workers=1) as silent:
        silent._binary = wrapper
        outcome = silent.render(req("{{ messages[0].content }}", [{"role": "user", "content": "u"}]))
        assert isinstance(outcome, Errored) and "no error logged in" in outcome.message, outcome
        # Every start sequence (the clock probe's, where libfaketime is found, and the cell's) gives up after
        # START_ATTEMPTS starts, each but its last counted as a lost reason.
        starts = len(count.read_text().splitlines())
        assert starts >= START_ATTEMPTS and starts % START_ATTEMPTS == 0, starts
        assert silent.lost_start_reasons == starts - starts // START_ATTEMPTS
