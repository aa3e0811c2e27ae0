"""A harness on runners.harness.serve, which holds a batch's answers: answers each conversation's first message
content, never answers one whose content is HANG, and exits at once (a crash) on CRASH. The witness that a
failure inside a held batch still costs only its own cell."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Rendered  # noqa: E402
from runners.harness import serve  # noqa: E402


def render(request):
    content = request.messages[0]["content"]
    if content == "HANG":
        time.sleep(3600)
    if content == "CRASH":
        os._exit(3)
    return Rendered(content)


serve({"name": "holder", "version": "1", "language": "python", "homepage": ""}, render)
