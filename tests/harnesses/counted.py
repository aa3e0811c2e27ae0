"""A protocol-2 harness that records every render it does: `counted.py LOG [--build B] [--error-on TEXT]`.

It renders "<build>|<template>|<first message's content>|<bos>" (a pure function of its build, the template and the
conversation, as a build requires), appends one line per render to LOG, and answers `errored` for a conversation
whose first message's content is TEXT. Without --build it gives no build identity, so chatgold must never
reuse its outcomes.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Errored, Rendered  # noqa: E402
from runners.harness import serve  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("log")
parser.add_argument("--build")
parser.add_argument("--error-on")
args = parser.parse_args()


def render(request):
    content = request.messages[0].get("content") if request.messages else None
    with open(args.log, "a", encoding="utf-8", errors="surrogatepass") as log:
        log.write(f"{request.template!r} {content!r}\n")
    if args.error_on is not None and content == args.error_on:
        return Errored("asked to fail on this conversation")
    return Rendered(f"{args.build}|{request.template}|{content}|{request.bos_token}")


serve({"name": "counted", "version": "1", "language": "python"}, render, build=args.build)
