"""An HF-faithful harness that speaks protocol version 1 only, as a harness written before version 2 does.

The engine is runners/examples/plain_jinja2.py (jinja2 with SEMANTICS.md's rules, which reproduces the
reference), so with no bug planted every cell must pass. Version 1 means: `start` with any other version is
answered with an error and the process exits (chatgold must start it again with version 1), there is no batch,
and a refusal has no kind: its message is "<ExceptionType>: <message>", as the reference's goldens store it.

    python tests/harnesses/protocol1.py [--bug NAME]... [--bare] [--errored-on-documents] [--slow-start SECONDS]

  --bug tojson-sorts-keys   the tojson filter sorts object keys
  --bug trim-does-nothing   the trim filter returns a string unchanged
  --bare                    refusal messages without their "<ExceptionType>: " prefix
  --errored-on-documents    answer `errored` (the harness's own failure) to every render with documents
  --slow-start SECONDS      sleep before answering `start` (widens the window of concurrent starts)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "runners", "examples"))

import plain_jinja2  # noqa: E402  (after the path above)

BUGS = ("tojson-sorts-keys", "trim-does-nothing")
ERRORED = "planted failure: this harness cannot take documents"


def _plant(bugs) -> None:
    env = plain_jinja2._ENV
    if "tojson-sorts-keys" in bugs:
        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=True)
        env.filters["tojson"] = tojson
    if "trim-does-nothing" in bugs:
        from jinja2.filters import do_trim

        env.filters["trim"] = lambda value, chars=None: value if isinstance(value, str) else do_trim(value, chars)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", action="append", default=[], choices=BUGS)
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--errored-on-documents", action="store_true")
    parser.add_argument("--slow-start", type=float, default=0.0)
    args = parser.parse_args()
    _plant(frozenset(args.bug))
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    name = "protocol1" + "".join(f"+{bug}" for bug in sorted(args.bug)) + ("+bare" if args.bare else "")

    def send(message: dict) -> None:
        out.write(json.dumps(message, ensure_ascii=True).encode("ascii") + b"\n")
        out.flush()

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        cmd = request.get("cmd")
        if cmd == "start":
            time.sleep(args.slow_start)
            if request.get("version") != 1:
                send({"error": f"unsupported protocol version {request.get('version')!r}"})
                return
            send({"name": name, "version": "1", "language": "python"})
        elif cmd == "render" and args.errored_on_documents and request.get("documents") is not None:
            send({"seq": request["seq"], "errored": {"message": ERRORED}})
        elif cmd == "render":
            outcome = plain_jinja2.render(request["template"], request["bos_token"], request["eos_token"], request)
            if outcome[0] == "rendered":
                send({"seq": request["seq"], "text": outcome[1]})
            else:
                message = outcome[2].partition(": ")[2] if args.bare else outcome[2]
                send({"seq": request["seq"], "raised": {"message": message}})
        elif cmd == "stop":
            return


if __name__ == "__main__":
    main()
