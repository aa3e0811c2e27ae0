"""`chatgold capabilities ...`: capability goldens (conformance/analysis/capabilities.py) and engine agreement
(conformance/analysis/agreement.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.cli.common import UserError


def cmd_capabilities_update(args) -> int:
    from conformance.analysis.capabilities import update_capability_goldens
    from conformance.corpus.manifest import load_corpus
    from conformance.render.store import CachedRunner, ResultStore
    from runners import REFERENCE_RUNNER, get_runner

    templates = load_corpus().select(args.template)
    # Capability goldens are always derived afresh; the probe outcomes go into the result store on the way.
    runner = CachedRunner(get_runner(REFERENCE_RUNNER, workers=args.workers), ResultStore(), refresh=True)
    try:
        written, failures = update_capability_goldens(templates, runner)
    finally:
        runner.close()
    print(f"capabilities: {len(templates)} templates, {written} written, {len(failures)} failed")
    for template_id, message in failures[:20]:
        print(f"  FAILED {template_id}: {message}", file=sys.stderr)
    return 1 if failures else 0


def cmd_capabilities_show(args) -> int:
    from conformance.analysis.capabilities import load_capabilities
    from conformance.corpus.manifest import load_corpus

    for entry in load_corpus().select(args.template):
        caps = load_capabilities(entry.id)
        print(json.dumps({"template": entry.id, "capabilities": caps}, ensure_ascii=False, sort_keys=True))
    return 0


def cmd_capabilities_compare(args) -> int:
    from conformance.analysis.agreement import agreement_section
    from conformance.corpus.manifest import load_corpus
    from conformance.render.store import CachedRunner, ResultStore
    from runners import get_runner

    templates = load_corpus().select(args.template)
    runner = CachedRunner(get_runner(args.runner, workers=args.workers), ResultStore())
    try:
        if not runner.reports_capabilities():
            raise UserError(f"--runner {args.runner}: this engine does not report template capabilities "
                            "(only runners whose reports_capabilities() is true can be compared)")
        summary = agreement_section(templates, runner)
    finally:
        runner.close()
    text = json.dumps(summary, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    if args.out:
        from conformance.files import atomic_write

        atomic_write(Path(args.out), text.encode("utf-8"))
    else:
        sys.stdout.write(text)
    for name, row in summary["capabilities"].items():
        print(f"{name}: {row['agree']}/{row['compared']} agree, {row['unknown']} unknown", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    caps = subparsers.add_parser("capabilities", help="capability goldens (goldens/<id>/capabilities.json)")
    actions = caps.add_subparsers(dest="capabilities_command", metavar="ACTION", required=True)
    p = actions.add_parser("update", help="derive capabilities with the reference and write the goldens")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_capabilities_update)
    p = actions.add_parser("show", help="print the stored capability goldens as JSON lines")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.set_defaults(func=cmd_capabilities_show)
    p = actions.add_parser("compare", help="agreement of an engine's own capability view with the goldens")
    p.add_argument("--runner", required=True, help="an engine runner that reports capabilities (llamacpp)")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", metavar="PATH", help="write the JSON summary here (default: stdout)")
    p.set_defaults(func=cmd_capabilities_compare)
