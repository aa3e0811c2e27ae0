"""A harness that misbehaves the ways the hardening tests need (stdlib only, no chatgold imports).

Usage: escaping.py MODE [PIDFILE]. MODE:
mute (reads start, never answers), noisy (writes NOISE_MB MiB to stderr before answering start, then serves),
setsid (starts a grandchild in a session of its own, writes its pid to PIDFILE, then serves),
doublefork (a child calls setsid, forks a grandchild that writes its pid to PIDFILE, and exits: the grandchild
is an orphan outside the harness's group and session; then serves). Renders answer the template text.
"""
import json
import os
import sys
import time

mode = sys.argv[1]
pidfile = sys.argv[2] if len(sys.argv) > 2 else None
out = sys.stdout.buffer


def send(message):
    out.write((json.dumps(message) + "\n").encode())
    out.flush()


def linger():
    os.closerange(0, 3)  # hold none of the harness's pipes: only the tree kill can end it
    while True:
        time.sleep(1)


if mode == "setsid":
    if os.fork() == 0:
        os.setsid()
        with open(pidfile, "w") as handle:
            handle.write(str(os.getpid()))
        linger()
elif mode == "doublefork":
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pidfile, "w") as handle:
                handle.write(str(os.getpid()))
            linger()
        os._exit(0)
    os.waitpid(child, 0)

for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if message["cmd"] == "start":
        if mode == "mute":
            continue
        if mode == "noisy":
            chunk = b"noise " * (1 << 16)
            for _ in range(int(os.environ.get("NOISE_MB", "64")) * (1 << 20) // len(chunk)):
                sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.write(b"\nthe last line of the noise\n")
            sys.stderr.buffer.flush()
        send({"name": f"escaping-{mode}", "version": "1", "language": "python", "homepage": ""})
    elif message["cmd"] == "render":
        send({"seq": message["seq"], "text": message["template"]})
    elif message["cmd"] == "stop":
        break
