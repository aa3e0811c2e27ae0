"""A minimal chatgold harness (runners/protocol/PROTOCOL.md, version 2 with version negotiation) in Python.

    python minimal_harness.py

The protocol side is the standard library only: read one JSON request per line on stdin, answer one JSON
line per render on stdout, logs on stderr. The engine is one function, `render_with_engine`; here it is
plain_jinja2.py (jinja2 with the rules of SEMANTICS.md), so this harness reproduces the reference. Put your
engine there, keep the rest, and check it: `chatgold harness validate -- python minimal_harness.py`.
"""
import json
import sys

VERSIONS = (1, 2)
INFO = {"name": "minimal-jinja2", "version": "1", "language": "python",
        "homepage": "https://jinja.palletsprojects.com/"}


def render_with_engine(template, bos_token, eos_token, conversation):
    """Your engine: ("rendered", text) | ("raised", kind, message) | ("skipped", reason).

    kind is compile (the template does not compile), raise (it called raise_exception) or render (anything
    else going wrong on this input). An exception escaping from here is reported as the harness's own error."""
    from plain_jinja2 import render

    return render(template, bos_token, eos_token, conversation)


def response(seq, outcome, version):
    if outcome[0] == "rendered":
        return {"seq": seq, "text": outcome[1]}
    if outcome[0] == "raised":
        raised = {"message": outcome[2]}
        if version >= 2:
            raised["kind"] = outcome[1]
        return {"seq": seq, "raised": raised}
    if outcome[0] == "skipped":
        return {"seq": seq, "skipped": {"reason": outcome[1]}}
    raise ValueError(f"unknown outcome {outcome!r}")


def answer(out, seq, template, bos_token, eos_token, conversation, version):
    try:
        message = response(seq, render_with_engine(template, bos_token, eos_token, conversation), version)
    except MemoryError:
        message = {"seq": seq, "errored": {"message": "out of memory"}}
    except Exception as exc:  # the harness's own failure, never the template's refusal
        message = {"seq": seq, "errored": {"message": f"{type(exc).__name__}: {exc}"}}
    send(out, message)


def send(out, message):
    # ensure_ascii: one pure-ASCII line whatever the text holds (a U+2028 cannot split it for any reader).
    out.write(json.dumps(message, ensure_ascii=True).encode("ascii") + b"\n")
    out.flush()


def main():
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must never reach the protocol stream
    version = 1
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        cmd = request.get("cmd")
        if cmd == "start":
            if request.get("version") not in VERSIONS:
                send(out, {"error": f"unsupported protocol version {request.get('version')!r}"})
                return
            version = request["version"]
            send(out, dict(INFO, protocol=2) if version == 2 else INFO)
        elif cmd == "render":
            answer(out, request["seq"], request["template"], request["bos_token"], request["eos_token"], request,
                   version)
        elif cmd == "batch" and version == 2:
            for offset, conversation in enumerate(request["cases"]):
                answer(out, request["seq"] + offset, request["template"], request["bos_token"],
                       request["eos_token"], conversation, version)
        elif cmd == "stop":
            return
        else:
            print(f"minimal_harness: ignoring {cmd!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
