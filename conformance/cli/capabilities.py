"""`chatgold capabilities ...`: capability goldens (conformance/capabilities.py) and engine agreement."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def cmd_capabilities_update(args) -> int:
    from runners import REFERENCE_RUNNER, get_runner

    from conformance.analysis.capabilities import update_capability_goldens
    from conformance.corpus.manifest import load_corpus

    templates = load_corpus().select(args.template)
    runner = get_runner(REFERENCE_RUNNER, workers=args.workers)
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
    from runners import get_runner

    from conformance.analysis.capabilities import agreement_summary, llamacpp_agreement
    from conformance.corpus.manifest import load_corpus

    if args.runner != "llamacpp":
        raise ValueError(f"--runner {args.runner}: only llamacpp reports template capabilities")
    templates = load_corpus().select(args.template)
    runner = get_runner(args.runner, workers=args.workers)
    if not callable(getattr(runner, "props", None)):
        runner.close()
        raise ValueError(f"runner {args.runner} cannot report /props yet (needs props(template, bos, eos) -> dict)")
    try:
        counts = llamacpp_agreement(templates, runner)
        summary = agreement_summary(counts, runner.describe())
    finally:
        runner.close()
    summary["templates"] = len(templates)
    text = json.dumps(summary, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    if args.out:
        from conformance.judge.goldens import atomic_write

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
    p.add_argument("--runner", required=True, help="engine runner (llamacpp)")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", metavar="PATH", help="write the JSON summary here (default: stdout)")
    p.set_defaults(func=cmd_capabilities_compare)
