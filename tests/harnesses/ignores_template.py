"""A harness that never reads the template (stdlib only): it speaks protocol version 2 flawlessly and renders
every conversation as ChatML, whatever template it is sent. `chatgold harness validate` must fail it."""
import json
import sys

out = sys.stdout.buffer


def send(message):
    out.write((json.dumps(message) + "\n").encode())
    out.flush()


def chatml(conversation):
    text = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n" for m in conversation["messages"])
    return text + ("<|im_start|>assistant\n" if conversation.get("add_generation_prompt") else "")


for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if message["cmd"] == "start":
        send({"name": "ignores-template", "version": "1", "protocol": 2})
    elif message["cmd"] == "render":
        send({"seq": message["seq"], "text": chatml(message)})
    elif message["cmd"] == "batch":
        for offset, conversation in enumerate(message["cases"]):
            send({"seq": message["seq"] + offset, "text": chatml(conversation)})
    elif message["cmd"] == "stop":
        break
