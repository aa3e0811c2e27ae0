"""`chatgold goldens ...`: the reference's goldens (update, orphans)."""
from __future__ import annotations

import sys

from conformance.cli.common import EXIT_FAIL, EXIT_OK, progress_printer


def cmd_goldens_update(args) -> int:
    from conformance.corpus.cases import load_cases, select_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.judge.goldens import reference_versions, update_goldens, write_meta
    from runners import REFERENCE_RUNNER, get_runner

    corpus = load_corpus()
    templates = corpus.select(args.template)
    all_cases = load_cases()
    cases = select_cases(all_cases, args.case)
    full = not args.template and not args.case
    from conformance.render.store import CachedRunner, ResultStore

    # Goldens are always rendered afresh; the outcomes go into the result store on the way, so the gate that
    # follows reads them instead of rendering them again.
    store = ResultStore()
    runner = CachedRunner(get_runner(REFERENCE_RUNNER, workers=args.workers), store, refresh=True)
    try:
        report = update_goldens(templates, cases, runner, prune=full, full=full,
                                progress=progress_printer("goldens"))
        from conformance.analysis.capabilities import update_capability_goldens

        caps_written, caps_failures = update_capability_goldens(templates, runner)
        print(f"capabilities: {len(templates)} templates, {caps_written} written")
        report.failures.extend((t, "capabilities.json", m) for t, m in caps_failures)
        from conformance.analysis.properties import update_property_goldens

        # a template's property record reads every case: any case added or changed can change it
        props_written, props_failures = update_property_goldens(templates, runner,
                                                                progress=progress_printer("properties"))
        print(f"properties: {len(templates)} templates, {props_written} written")
        report.failures.extend((t, "properties.json", m) for t, m in props_failures)
    finally:
        runner.close()
    store.prune_if_needed()
    write_meta(reference_versions())
    print(f"goldens: {report.cells} cells, {report.written} written, {len(report.removed)} orphans removed")
    for template_id, case_id, message in report.failures[:20]:
        print(f"  FAILED {template_id}/{case_id}: {message}", file=sys.stderr)
    if report.failures:
        print(f"{len(report.failures)} cells could not be produced by the reference; their goldens were kept",
              file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def cmd_goldens_orphans(args) -> int:
    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.judge.goldens import find_orphans

    orphans = find_orphans([e.id for e in load_corpus().entries], [c.id for c in load_cases()])
    for path in orphans:
        print(path)
    print(f"{len(orphans)} orphan golden(s)", file=sys.stderr)
    return EXIT_FAIL if orphans else EXIT_OK


def register(sub) -> None:
    goldens = sub.add_parser("goldens", help="the reference's goldens (goldens/)").add_subparsers(
        dest="goldens_command", metavar="ACTION", required=True)
    p = goldens.add_parser("update", help="regenerate goldens with the reference runner")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--case", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_goldens_update)
    p = goldens.add_parser("orphans", help="list goldens that no (template, case) pair produces")
    p.set_defaults(func=cmd_goldens_orphans)
