"""A harness for an engine that lacks things the reference has, for testing the engine author's path.

It is runners/examples/minimal_harness.py's engine (plain_jinja2.py, faithful to the reference) with parts
taken away, each switched off by default and on by a flag:

  --no-raise-exception   the global raise_exception is not bound (calling it is an undefined-call failure)
  --no-strftime-now      the global strftime_now is not bound
  --no-trim-blocks       the environment keeps the newline after a block tag (trim_blocks off)
  --protocol 1           speak protocol version 1 only (refuse version 2, as version 1 says)
  --name NAME            the name the harness gives itself at start
  --build B              (version 2) the build identity it gives at start
  --unsupported          answer every compile failure as a refusal of kind `unsupported`
  --delay S              sleep S seconds before each render (a slow engine)

    python tests/harnesses/lacking.py --no-raise-exception --no-trim-blocks --protocol 1
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "runners", "examples"))

import minimal_harness  # noqa: E402
import plain_jinja2  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-raise-exception", action="store_true")
    parser.add_argument("--no-strftime-now", action="store_true")
    parser.add_argument("--no-trim-blocks", action="store_true")
    parser.add_argument("--unsupported", action="store_true")
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=2)
    parser.add_argument("--name", default="lacking-jinja2")
    parser.add_argument("--build")
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    env = plain_jinja2.environment()
    env.trim_blocks = not args.no_trim_blocks
    if args.no_raise_exception:
        env.globals.pop("raise_exception", None)
    if args.no_strftime_now:
        env.globals.pop("strftime_now", None)
    plain_jinja2._ENV = env
    minimal_harness.VERSIONS = (1,) if args.protocol == 1 else (1, 2)
    minimal_harness.INFO = dict(minimal_harness.INFO, name=args.name)
    if args.build:
        minimal_harness.INFO["build"] = args.build
    if args.delay:
        import time

        engine = minimal_harness.render_with_engine

        def slow(*request):
            time.sleep(args.delay)
            return engine(*request)

        minimal_harness.render_with_engine = slow
    if args.unsupported:
        faithful = minimal_harness.render_with_engine

        def render_with_engine(*request):
            outcome = faithful(*request)
            if outcome[0] == "raised" and outcome[1] == "compile":
                return ("raised", "unsupported", outcome[2])
            return outcome

        minimal_harness.render_with_engine = render_with_engine
    minimal_harness.main()


if __name__ == "__main__":
    main()
