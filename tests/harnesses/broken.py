"""A deliberately broken harness for the protocol's failure-path tests (stdlib only, no chatgold imports).

Usage: broken.py MODE. Renders whose template is "BREAK" misbehave as MODE says; every other render answers
with the template text, so a test can show that the run goes on after the failure. MODE:
crash (exit 3 after a stderr line), hang (never answer), badjson (print garbage), wrongseq (answer seq+100),
extrafield (a response with a field the schema does not allow), slowstart (no start response for 60 s),
badutf8 (a response line that is not UTF-8), hugeline (a 40 MB response line), allocate (take 1 GB of memory,
touching it, then answer), ok (never misbehave).
"""
import json
import sys
import time

mode = sys.argv[1]
out = sys.stdout.buffer


def send(message):
    out.write((json.dumps(message) + "\n").encode())
    out.flush()


for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if message["cmd"] == "start":
        if mode == "slowstart":
            time.sleep(60)
        send({"name": f"broken-{mode}", "version": "1", "language": "python", "homepage": ""})
    elif message["cmd"] == "render":
        seq = message["seq"]
        if message["template"] != "BREAK" or mode == "ok":
            send({"seq": seq, "text": message["template"]})
        elif mode == "crash":
            print("broken harness: about to crash on purpose", file=sys.stderr, flush=True)
            sys.exit(3)
        elif mode == "hang":
            time.sleep(3600)
        elif mode == "badjson":
            out.write(b"this is not json\n")
            out.flush()
        elif mode == "wrongseq":
            send({"seq": seq + 100, "text": "late"})
        elif mode == "extrafield":
            send({"seq": seq, "text": "x", "debug": "not in the schema"})
        elif mode == "hugeline":
            send({"seq": seq, "text": "x" * (40 * 1024 * 1024)})
        elif mode == "allocate":
            hoard = bytearray(1024**3)
            send({"seq": seq, "text": f"allocated {len(hoard)} bytes"})
        elif mode == "badutf8":
            out.write(b'{"seq": %d, "text": "\xff\xfe"}\n' % seq)
            out.flush()
    elif message["cmd"] == "stop":
        break
