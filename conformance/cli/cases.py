"""`chatgold cases list`: the conversation cases."""
from __future__ import annotations

import json
import sys

from conformance.cli.common import EXIT_OK


def cmd_cases_list(args) -> int:
    from conformance.corpus.cases import load_cases, select_cases

    cases = select_cases(load_cases(), args.case, args.feature)
    if args.json:
        json.dump([c.to_dict() for c in cases], sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    for case in cases:
        print(f"{case.id}  [{', '.join(case.features)}]  {case.description}")
    print(f"{len(cases)} cases", file=sys.stderr)
    return EXIT_OK


def register(sub) -> None:
    cases = sub.add_parser("cases", help="the conversation cases").add_subparsers(
        dest="cases_command", metavar="ACTION", required=True)
    p = cases.add_parser("list", help="list cases with their feature tags")
    p.add_argument("--case", action="append", metavar="GLOB")
    p.add_argument("--feature", action="append", metavar="TAG")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cases_list)
