"""`chatgold check`, `chatgold expectations update`, `chatgold report merge`: engines against the goldens."""
from __future__ import annotations

import sys

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError, progress_printer
from conformance.cli.options import (
    add_cache_option,
    add_expectations_dir,
    add_explain_options,
    add_outputs,
    add_selection,
    open_runner,
    selection_from_args,
    store_from_args,
)


def cmd_check(args) -> int:
    from conformance.analysis.agreement import agreement_section, load_agreement
    from conformance.checkrun import Outputs
    from conformance.render.store import CachedRunner
    from conformance.report.render import terminal
    from conformance.service.client import ServiceError

    selection = selection_from_args(args)
    # A precomputed agreement wins: no need to ask the engine again.
    agreement = [load_agreement(args.capability_agreement) if args.capability_agreement else None]
    judge = None
    if args.service:
        from conformance.service.client import ServiceClient, ServiceJudge

        judge = ServiceJudge(ServiceClient(args.service))
    check = check_run(args, selection, judge=judge, explain=not (args.no_explain or args.service),
                      attribute=not (args.no_attribution or args.service))

    def while_open(spec, runner, results) -> None:
        if agreement[0] is None and runner.reports_capabilities():
            agreement[0] = agreement_section(selection.templates, CachedRunner(runner, check.store, check.refresh))
        note_missing_baseline(results, spec)

    try:
        with check:
            runs = check.check_all(args.runner, lambda spec: open_runner(spec, args), progress_printer, while_open)
    except ServiceError as exc:
        raise UserError(str(exc)) from None
    check.store.prune_if_needed()
    report, paths = check.report(runs, selection, Outputs.from_args(args), agreement[0], analysis=True)
    print(terminal(report))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


def check_run(args, selection, judge=None, explain: bool = True, attribute: bool = False, tokens: bool = True,
              everything: bool = False, recording: bool = False):
    """The CheckRun a checking command configures from its options: the result store, the baseline folder,
    and root causes (conformance/explain) held against each runner's baseline, the reference opened once for
    all runners and each runner's causes summarised on the terminal."""
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.cli.explain import describe_causes

    store, refresh = store_from_args(args)
    options = None
    if explain:
        options = ExplainOptions(everything=everything, bare=recording, cache=not getattr(args, "no_cache", False),
                                 budget=getattr(args, "budget", None), max_groups=getattr(args, "max_groups", None),
                                 progress=lambda spec: progress_printer(f"{spec} causes", unit="groups"),
                                 report=lambda explanation: print(describe_causes(explanation, 5), file=sys.stderr))
    return CheckRun(selection.cells(), judge=judge, expectations_dir=args.expectations, store=store,
                    refresh=refresh, tokens=tokens, explain=options, attribute=attribute,
                    families={t.id: t.family for t in selection.templates}, workers=args.workers,
                    timeout=args.timeout)


def cmd_expectations_update(args) -> int:
    from conformance.judge.expectations import update_expectations
    from conformance.judge.status import describe_figure

    selection = selection_from_args(args)
    args.expectations = update_directory(args.runner, args.expectations)
    # Baselines hold byte statuses only: the token verdict is not asked for.
    check = check_run(args, selection, explain=not args.no_explain, tokens=False, everything=args.reexplain,
                      recording=True)
    with check:
        [results] = check.check_all([args.runner], lambda spec: open_runner(spec, args), progress_printer)
    check.store.prune_if_needed()
    causes = None
    if results.explanation is not None:
        causes = {cause.id: cause.to_dict() for cause in results.explanation.causes}
    cells = check.cells
    selected = None if selection.full else {c.key for c in cells}
    expectations, counts = update_expectations(results.name, results.results, selected, args.expectations, causes)
    print(f"{results.name} {results.info.get('version', '')}: {describe_figure(results.figure())}")
    print(f"{expectations.path}: {counts['total']} known non-matching cells "
          f"({counts['added']} added, {counts['removed']} removed, {counts['changed']} changed) "
          f"from {len(cells)} {'cells (full matrix)' if selection.full else 'selected cells'}; "
          f"{counts['causes']} root causes, {counts['causes_without_reason']} without a reason yet")
    print(f"reasons carried over: {counts['reasons_by_id']} by cause id, {counts['reasons_by_cells']} by the cells "
          f"the old cause held (a cause merged or split by mechanism)")
    if counts["reasons_merged"]:
        print(f"{len(counts['reasons_merged'])} causes hold several old reasons, joined (rewrite each as one): "
              + ", ".join(counts["reasons_merged"]))
    if counts["reasons_dropped"]:
        print(f"{len(counts['reasons_dropped'])} old reasons went to no cause (their cells match now or are not "
              f"explained): " + ", ".join(counts["reasons_dropped"]))
    return EXIT_OK


def cmd_expectations_merge(args) -> int:
    from conformance.explain.baseline_merge import load_part, merge_expectations
    from conformance.judge.expectations import ExpectationsError
    from conformance.judge.pipeline import parse_shard

    runner = args.runner.split("@")[0]
    directory = update_directory(args.runner, args.expectations)
    parts = []
    try:
        for shard, path in args.part:
            try:
                index, count = parse_shard(shard)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            parts.append((index, count, load_part(path, runner)))
        merged, counts = merge_expectations(runner, parts, directory)
    except ExpectationsError as exc:
        raise UserError(str(exc)) from None
    print(f"{merged.path}: {counts['cells']} known non-matching cells in {counts['templates']} templates from "
          f"{counts['shards']} shards; {counts['causes']} root causes ({counts['found_in_several']} found in "
          f"several shards, kept once), {counts['causes_without_reason']} without a reason yet")
    return EXIT_OK


def cmd_expectations_minimize(args) -> int:
    from contextlib import nullcontext

    from conformance.explain import formats
    from conformance.explain.causes import _reduction_runner, _scratch_artefacts
    from conformance.explain.finish import finish_baseline
    from conformance.judge.expectations import ExpectationsError, load_expectations, write_expectations
    from runners import REFERENCE_RUNNER, get_runner

    runner = args.runner.split("@")[0]
    directory = update_directory(args.runner, args.expectations)
    try:
        baseline = load_expectations(runner, directory)
    except ExpectationsError as exc:
        raise UserError(str(exc)) from None
    if not baseline.causes:
        raise UserError(f"{baseline.path}: no root causes to finish")
    unknown = sorted(set(args.cause or ()) - set(baseline.causes))
    if unknown:
        raise UserError(f"{baseline.path}: no cause {', '.join(unknown)}")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    with get_runner(REFERENCE_RUNNER) as reference, get_runner(args.runner) as engine:
        reducer = _reduction_runner(engine, log)
        with _scratch_artefacts(engine), (_scratch_artefacts(reducer) if reducer is not engine else nullcontext()):
            detect = formats.detector_for(runner)
            if detect is not None:   # keyed by built-in format, not by mechanism: its own finishing
                new, counts = formats.finish_format_baseline(baseline, detect, reference, reducer, engine,
                                                             only=set(args.cause) if args.cause else None, log=log)
            else:
                new, counts, _ = finish_baseline(baseline, reducer, reference, template=not args.data_only,
                                                 only=set(args.cause) if args.cause else None, log=log,
                                                 confirm=engine)
    write_expectations(new)
    print(f"{new.path}: {counts['causes_before']} -> {counts['causes_after']} root causes; {counts['reduced']} "
          f"reproducers reduced further, {counts['renamed']} keyed anew, {counts['merged']} merged into another "
          f"of the same mechanism, {counts['kept']} kept as recorded")
    return EXIT_OK


def update_directory(spec: str, directory):
    """Where `expectations update` writes: the folder the user chose; for a `command:` harness without one,
    ./chatgold-expectations; a runner the suite ships needs the folder named (the suite's own baselines change
    only when asked for by path). Never the installed package by default."""
    from conformance.judge.expectations import AUTHOR_DIR, baseline_directory, chosen_directory
    from runners import EXAMPLE_HARNESSES

    suite_runner = not spec.startswith("command:")
    if suite_runner and chosen_directory(directory) is None:
        shipped = "example harness" if spec in EXAMPLE_HARNESSES else "runner"
        raise UserError(f"{spec} is a {shipped} the suite ships: name the folder to write its baseline to, "
                        f"--expectations {AUTHOR_DIR}/ for your own copy, or --expectations conformance/expectations "
                        f"(in a chatgold checkout) to re-record the suite's")
    return baseline_directory(suite_runner, directory)


def note_missing_baseline(results, spec: str) -> None:
    """Say so when a `command:` harness has no baseline yet: every non-matching cell is then unexpected."""
    path = results.expectations.path
    if spec.startswith("command:") and path is not None and not path.exists():
        print(f"{results.name}: no baseline at {path}: every non-matching cell is unexpected (record one with "
              f"`chatgold expectations update --runner {spec!r} --expectations {path.parent}`)", file=sys.stderr)


def cmd_report_merge(args) -> int:
    from conformance.report import load_report, merge_reports, write_outputs
    from conformance.report.render import terminal

    report = merge_reports(load_report(p) for p in args.inputs)
    write_outputs(report, args.output, args.junit, args.markdown, args.badges, args.html)
    print(terminal(report, show_unexpected=5))
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("check", help="check engines against the goldens and report divergences",
                       description="Render the selection through each runner and judge every cell against its "
                                   "golden and the runner's baseline (expectations). Exit 1 when any cell is not "
                                   "as the baseline says; 2 on bad input.")
    p.add_argument("--runner", action="append", required=True, metavar="R",
                   help="runner spec (repeatable): a name (see `chatgold engines list`) or command:'<argv>'")
    add_selection(p)
    add_expectations_dir(p)
    p.add_argument("--json", metavar="PATH",
                   help="JSON report (conformance/schemas/report.schema.json) and, beside it, one record per "
                        "cell that is not a pass (<name>.cells.jsonl.gz)")
    add_outputs(p)
    p.add_argument("--no-attribution", action="store_true",
                   help="skip the evaluator's byte provenance for diverged cells")
    add_explain_options(p)
    p.add_argument("--service", metavar="URL",
                   help="judge each rendered cell through a `chatgold serve` (which holds the goldens) instead of "
                        "the local goldens; errors, timeouts and skips stay local")
    p.add_argument("--capability-agreement", metavar="PATH",
                   help="include this capability agreement summary (`chatgold capabilities compare --out`) "
                        "instead of computing it with a runner that reports capabilities")
    add_cache_option(p)
    p.set_defaults(func=cmd_check)

    expectations = sub.add_parser("expectations", help="known divergences per engine").add_subparsers(
        dest="expectations_command", metavar="ACTION", required=True)
    p = expectations.add_parser("update", help="rewrite a runner's baseline from a fresh run (a selection "
                                               "updates only the selected cells)")
    p.add_argument("--runner", required=True, metavar="R")
    add_selection(p)
    add_expectations_dir(p)
    add_explain_options(p)
    p.add_argument("--reexplain", action="store_true",
                   help="explain every non-matching cell afresh (default: cells the baseline knows keep their cause)")
    add_cache_option(p)
    p.set_defaults(func=cmd_expectations_update)

    p = expectations.add_parser(
        "merge", help="combine baselines recorded by `expectations update --shard I/N` into one",
        description="Each template's cells come from the recording of the shard that owns it; causes are "
                    "deduplicated by id, each with the smallest reproducer a shard confirmed and every reason "
                    "the shards carried.")
    p.add_argument("--runner", required=True, metavar="R")
    p.add_argument("--part", nargs=2, action="append", required=True, metavar=("I/N", "PATH"),
                   help="shard I of N and its recorded baseline (the file, or the folder holding <runner>.json); "
                        "once per shard")
    add_expectations_dir(p)
    p.set_defaults(func=cmd_expectations_merge)

    p = expectations.add_parser(
        "minimize", help="finish reducing a baseline's stored reproducers to 1-minimal, then key them by mechanism",
        description="Each reproducer a single step of the reducer still shrinks is taken down step by step (both "
                    "sides rendered every time); causes whose finished reproducers have one key (one mechanism) "
                    "become one cause, with all their cells and every reason.")
    p.add_argument("--runner", required=True, metavar="R")
    p.add_argument("--cause", action="append", metavar="ID", help="only this cause (repeatable)")
    p.add_argument("--data-only", action="store_true",
                   help="only the data steps (an engine that never evaluates the template)")
    add_expectations_dir(p)
    p.set_defaults(func=cmd_expectations_minimize)

    report = sub.add_parser("report", help="divergence reports").add_subparsers(
        dest="report_command", metavar="ACTION", required=True)
    p = report.add_parser("merge", help="combine shard JSON reports into one and re-render the other outputs")
    p.add_argument("output", metavar="OUT.json")
    p.add_argument("inputs", nargs="+", metavar="IN.json")
    add_outputs(p)
    p.set_defaults(func=cmd_report_merge)

