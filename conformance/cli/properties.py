"""`chatgold properties ...`: golden-free properties of each template (conformance/analysis/properties.py),
stored as goldens/<id>/properties.json."""
from __future__ import annotations

import json
import sys

from conformance.cli.common import EXIT_FAIL, EXIT_OK, progress_printer


def cmd_properties_update(args) -> int:
    from conformance.analysis.properties import update_property_goldens
    from conformance.corpus.manifest import load_corpus
    from runners import REFERENCE_RUNNER, get_runner

    templates = load_corpus().select(args.template)
    runner = get_runner(REFERENCE_RUNNER, workers=args.workers)
    try:
        written, failures = update_property_goldens(templates, runner, progress=progress_printer("properties"))
    finally:
        runner.close()
    print(f"properties: {len(templates)} templates, {written} written, {len(failures)} failed")
    for template_id, message in failures[:20]:
        print(f"  FAILED {template_id}: {message}", file=sys.stderr)
    return EXIT_FAIL if failures else EXIT_OK


def cmd_properties_show(args) -> int:
    from conformance.analysis.properties import load_properties
    from conformance.corpus.manifest import load_corpus

    for entry in load_corpus().select(args.template):
        print(json.dumps({"template": entry.id, "properties": load_properties(entry.id)}, ensure_ascii=False,
                         sort_keys=True))
    return EXIT_OK


def cmd_properties_summary(args) -> int:
    from conformance.analysis.properties import load_properties, summarize
    from conformance.corpus.manifest import load_corpus

    entries = load_corpus().select(args.template)
    records = {e.id: r for e in entries if (r := load_properties(e.id)) is not None}
    summary = summarize(records)
    if args.json:
        print(json.dumps({"templates": len(entries), "recorded": len(records), "properties": summary},
                         sort_keys=True, indent=1))
        return EXIT_OK
    print(f"{len(records)} of {len(entries)} templates have a properties.json")
    for name, row in summary.items():
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(row["violation_kinds"].items(), key=lambda kv: -kv[1]))
        also = ", ".join(f"{k} {n}" for k, n in sorted(row["exception_kinds"].items(), key=lambda kv: -kv[1]))
        print(f"{name:18s} violation {row['violation']:4d}  exception only {row['exception']:4d}  "
              f"pass {row['pass']:4d}  n/a {row['not-applicable']:4d}")
        if kinds:
            print(f"{'':18s}   violations: {kinds}")
        if also:
            print(f"{'':18s}   intended exceptions: {also}")
    return EXIT_OK


def register(subparsers) -> None:
    props = subparsers.add_parser("properties", help="golden-free template properties (goldens/<id>/properties.json)")
    actions = props.add_subparsers(dest="properties_command", metavar="ACTION", required=True)
    p = actions.add_parser("update", help="check the properties through the reference and write the records")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_properties_update)
    p = actions.add_parser("show", help="print the stored property records as JSON lines")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.set_defaults(func=cmd_properties_show)
    p = actions.add_parser("summary", help="templates per property: violation, intended exception only, pass")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_properties_summary)
