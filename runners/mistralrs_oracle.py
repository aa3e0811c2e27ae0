"""Ask the real `mistralrs` wheel whether it renders a chat request to an exact text (the `mistralrs` runner's check).

The Python package never returns the rendered prompt, but it reports how many tokens the prompt had. So the
chat template is wrapped: the original renders into a variable, and the wrapper prints 40 characters when that
variable equals the expected text and one otherwise; `usage.prompt_tokens` then says which. The model is a
tiny GGUF carrier (runners/llamacpp/model.py) holding the cell's BOS/EOS texts; the request goes through
`Runner.send_chat_completion_request` exactly as a user's would (messages as given, tools as tool_schemas,
enable_thinking / reasoning_effort), with max_tokens=1. A request the wheel refuses reports its message.

Run by the interpreter of a cached environment holding mistralrs and gguf (`ensure_oracle()`), one JSON
request per line on stdin: {template, bos_token, eos_token, messages, tools, kwargs, expected}; one answer per
line: {"equal": bool} or {"refused": message}.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

WHEEL_VERSION = "0.9.5"
REQUIREMENTS = [f"mistralrs=={WHEEL_VERSION}", "gguf==0.19.0"]
MARK = "Y" * 40


def ensure_oracle():
    """The python of the cached environment holding the real mistralrs wheel."""
    from .versions import ensure_venv

    return ensure_venv(f"mistralrs-{WHEEL_VERSION}", REQUIREMENTS, f"mistralrs {WHEEL_VERSION}",
                       pip_options=["--only-binary", ":all:"])


def wrap(template: str, expected: str) -> str:
    """The equality probe; `{{ '' }}` keeps trim_blocks/lstrip_blocks from touching the original's edges."""
    return ("{% set __chatgold_out %}{{ '' }}" + template + "{{ '' }}{% endset %}"
            "{% if __chatgold_out == " + json.dumps(expected) + " %}" + MARK + "{% else %}N{% endif %}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mistralrs import ChatCompletionRequest, Runner, Which

    from .llamacpp.model import write_model

    work = Path(tempfile.mkdtemp(prefix="chatgold-mistralrs-"))
    models: dict = {}
    # The answers own the real stdout; the engine's own logging (written to fd 1 from Rust) goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        key = (job.get("bos_token"), job.get("eos_token"))
        if key not in models:
            path = work / f"m{len(models)}.gguf"
            write_model(path, "{{ messages }}", *key)
            models[key] = path
        model = models[key]
        explicit = work / "probe.jinja"
        explicit.write_text(wrap(job["template"], job["expected"]), encoding="utf-8")
        kwargs = job.get("kwargs") or {}
        request = {"model": "chatgold", "messages": job["messages"], "max_tokens": 1, "temperature": 0.0}
        if job.get("tools"):
            request["tool_schemas"] = [json.dumps(tool) for tool in job["tools"]]
        for name in ("enable_thinking", "reasoning_effort"):
            if name in kwargs:
                request[name] = kwargs[name]
        try:
            runner = Runner(which=Which.GGUF(quantized_model_id=str(model.parent), quantized_filename=model.name),
                            token_source="none", max_seqs=1, no_paged_attn=True, jinja_explicit=str(explicit))
            response = runner.send_chat_completion_request(ChatCompletionRequest(**request))
            answer = {"equal": response.usage.prompt_tokens >= len(MARK)}
        except BaseException as exc:  # the product refused the request or the template: its message
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            # a Rust panic (a request the Python API indexes blindly) is pyo3's PanicException, a BaseException
            answer = {"refused": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:  # from this project's environment: install the wheel's environment now
        print(ensure_oracle())
    else:
        main()


class Oracle:
    """Client side: one oracle process; `check(request, outcome)` -> (agrees, what the wheel said)."""

    def __init__(self, timeout: float = 60.0):
        import subprocess

        from .versions import checkout_harness

        argv, env = checkout_harness(ensure_oracle(), "runners.mistralrs_oracle")
        self.timeout = timeout
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=dict(env, HF_HUB_OFFLINE="1", TZ="UTC"), text=True, start_new_session=True)

    def ask(self, request, expected: str) -> dict:
        job = {"template": request.template, "bos_token": request.bos_token, "eos_token": request.eos_token,
               "messages": request.messages, "tools": request.tools, "kwargs": dict(request.kwargs),
               "expected": expected}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the mistralrs oracle exited (exit code {self.proc.poll()})")
        return json.loads(line)

    def check(self, request, outcome) -> tuple:
        """Whether the wheel agrees with a reproduced outcome: a Rendered text must be exactly the wheel's
        prompt; a Raised refusal must be a refusal of the wheel carrying the same message."""
        from .base import Raised, Rendered

        if isinstance(outcome, Rendered):
            answer = self.ask(request, outcome.text)
            return answer.get("equal") is True, answer
        if isinstance(outcome, Raised):
            answer = self.ask(request, "")
            said = answer.get("refused", "")
            core = outcome.message.split(" (in ")[0]
            return bool(said) and core in said, answer
        return False, {"not comparable": outcome.kind}

    def close(self) -> None:
        from .base import kill_process_group

        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                kill_process_group(self.proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def verifiable(request) -> bool:
    """Cells where the GGUF carrier is the model the reproduction assumes: BOS and EOS both present (the
    carrier must hold some BOS/EOS text; a model without one has no faithful GGUF), no unk_token use (the
    carrier's is `<unk>`, the reproduction binds none), and no clock: the wheel reads the real time."""
    if request.bos_token is None or request.eos_token is None or "unk_token" in request.template:
        return False
    # The wheel reads the real clock (date_string, strftime_now); the reproduction reads the case's.
    return not any(word in request.template for word in ("date_string", "strftime_now"))


def verify(requests, outcomes) -> dict:
    """Ask the wheel about every comparable (request, reproduced outcome); returns counts and disagreements."""
    from .base import Raised, Rendered

    counts = {"agree": 0, "disagree": 0, "not_checked": 0}
    disagreements = []
    with Oracle() as oracle:
        for request, outcome in zip(requests, outcomes):
            if not verifiable(request) or not isinstance(outcome, (Rendered, Raised)):
                counts["not_checked"] += 1
                continue
            if isinstance(outcome, Rendered) and ("[::-1]" in outcome.text or "generation" in outcome.text):
                counts["not_checked"] += 1
                continue
            agrees, answer = oracle.check(request, outcome)
            if agrees:
                counts["agree"] += 1
            else:
                counts["disagree"] += 1
                disagreements.append({"template": request.template_id, "case": request.case_id,
                                      "reproduced": outcome.kind, "wheel": answer})
    return {"counts": counts, "disagreements": disagreements}
