"""A harness on runners.harness.serve that keeps conversations: `keeper.py LOG N` offers to keep N, appends every
line it receives to LOG, answers "<template>:<contents>@<pid>", exits at once on the template EXIT (a crash
between batches) and empties the messages it is handed on the template MUTATE. The witness of what `keep` puts
on the wire."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Rendered  # noqa: E402
from runners.harness import serve  # noqa: E402

log = open(sys.argv[1], "ab", buffering=0)


class Tee:
    """stdin whose lines are copied to the log as they are read."""

    @property
    def buffer(self):
        for line in sys.__stdin__.buffer:
            log.write(line)
            yield line


def render(request):
    if request.template == "EXIT":
        os._exit(3)
    if request.template == "MUTATE":  # an engine that changes the data it is handed while rendering
        request.messages.clear()
    contents = "|".join(str(m.get("content")) for m in request.messages)
    return Rendered(f"{request.template}:{contents}@{os.getpid()}")


sys.stdin = Tee()
serve({"name": "keeper", "version": "1", "language": "python", "homepage": ""}, render, keep=int(sys.argv[2]))
