"""`chatgold harness validate`: drive a harness with probe renders and check every message."""
from __future__ import annotations

import argparse

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError


def cmd_harness_validate(args) -> int:
    from runners.protocol.validate import validate_harness

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UserError("give the harness command line after --, e.g. chatgold harness validate -- node harness.mjs")
    ok = validate_harness(command, timeout=args.timeout, start_timeout=args.start_timeout)
    return EXIT_OK if ok else EXIT_FAIL


def register(sub) -> None:
    from runners.protocol.validate import EXIT_CODES, add_timeouts

    harness = sub.add_parser("harness", help="engine harnesses speaking the protocol (runners/protocol)").add_subparsers(
        dest="harness_command", metavar="ACTION", required=True)
    p = harness.add_parser(
        "validate", help="drive a harness with probe renders and check every message against the schemas",
        usage="chatgold harness validate [--timeout S] [--start-timeout S] -- <harness argv...>", epilog=EXIT_CODES,
        description="Start the harness, send probe renders (tools, documents, continue_final_message, kwargs, null "
                    "keys, reasoning aliases, the clock, one refusal of each kind, template and data sensitivity, "
                    "a batch) and validate every line against the protocol's schemas. FAIL: the protocol is broken, "
                    "the harness ignores the template or the conversation, or a refusal is answered as something "
                    "else. DIFF: the output differs from the reference's (the engine's own behaviour, which "
                    "`chatgold check` measures).")
    add_timeouts(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- ARGV", help="-- and the harness command line")
    p.set_defaults(func=cmd_harness_validate)
