"""`chatgold site`: a static site of every engine, template and cause from report files (docs/site.md)."""
from __future__ import annotations

import sys

from conformance.cli.common import EXIT_OK


def cmd_site(args) -> int:
    from conformance.report.emit import FORMATS
    from conformance.report.site import build_site

    formats = None if args.emit_formats == "own" else FORMATS if args.emit_formats == "all" else \
        [f for f in args.emit_formats.split(",") if f]
    unknown = sorted(set(formats or ()) - set(FORMATS))
    if unknown:
        raise ValueError(f"--emit-formats: unknown format(s) {', '.join(unknown)} (known: {', '.join(FORMATS)})")
    stats = build_site(args.reports, args.out, args.history, formats)
    print(f"wrote {args.out}: {stats['pages']} pages, {stats['files']} files, {stats['bytes'] / 1e6:.1f} MB "
          f"({stats['engines']} engine(s), {stats['templates']} template(s), {stats['causes']} cause(s)) "
          f"in {stats['seconds']:.1f} s", file=sys.stderr)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("site", help="build a static site of engines, templates and causes from reports",
                       description="Build a static, browsable site (no server, no network) from report files "
                                   "written by `chatgold check --json` or the gate (report.json and its sidecar "
                                   "report.cells.jsonl.gz): an index of engines and versions, a page per engine "
                                   "(ranked causes with reproducers and emitted tests), per template and per "
                                   "cause, client-side search, badges. Imports no engine.")
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="report JSON(s); one per engine version")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: new, empty, or a site chatgold built before (replaced)")
    p.add_argument("--history", action="append", default=[], metavar="PATH",
                   help="a `chatgold history --history-json` file: its conformance by version on the index")
    p.add_argument("--emit-formats", default="own", metavar="F,F",
                   help="tests emitted beside each cause: `own` (default: the engine's own format(s), json and "
                        "issue), `all`, or a list of pytest,minijinja,hfjs,llamacpp,json,issue")
    p.set_defaults(func=cmd_site)
