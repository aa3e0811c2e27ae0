"""`chatgold harness validate`: drive a harness with probe renders and check every message."""
from __future__ import annotations

import argparse


def cmd_harness_validate(args) -> int:
    from runners.protocol.validate import main as validate_main

    return validate_main(args.rest)


def register(sub) -> None:
    harness = sub.add_parser("harness", help="engine harnesses speaking the protocol (runners/protocol)").add_subparsers(
        dest="harness_command", metavar="ACTION", required=True)
    p = harness.add_parser("validate", help="drive a harness with probe renders and check every message against the schemas",
                           description="chatgold harness validate [--timeout S] -- <harness argv...>")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- ARGV", help="options, then -- and the harness command line")
    p.set_defaults(func=cmd_harness_validate)
