"""A harness that answers every render with "<template>@<its own pid>" (stdlib only): shows which process
rendered which cell."""
import json
import os
import sys

out = sys.stdout.buffer
for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if message["cmd"] == "start":
        reply = {"name": "whoami", "version": "1", "language": "python", "homepage": ""}
    elif message["cmd"] == "render":
        reply = {"seq": message["seq"], "text": f"{message['template']}@{os.getpid()}"}
    else:
        break
    out.write((json.dumps(reply) + "\n").encode())
    out.flush()
