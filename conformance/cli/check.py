"""`chatgold check`, `chatgold expectations update`, `chatgold report merge`: engines against the goldens."""
from __future__ import annotations

import sys
from pathlib import Path

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError, progress_printer


def add_selection(p, workers: bool = True) -> None:
    p.add_argument("--template", action="append", default=[], metavar="GLOB",
                   help="template ids to include (repeatable; case-insensitive)")
    p.add_argument("--case", action="append", default=[], metavar="GLOB",
                   help="case ids to include (repeatable; case-insensitive)")
    p.add_argument("--feature", action="append", default=[], metavar="TAG", help="only cases with this feature tag")
    p.add_argument("--shard", metavar="I/N", help="shard I of N (whole templates per shard)")
    if workers:
        p.add_argument("--workers", type=int, default=2, help="engine processes per runner (default 2)")
        p.add_argument("--timeout", type=float, default=20.0, metavar="S",
                       help="seconds one render may take before the cell is a timeout (default 20)")


def add_outputs(p) -> None:
    p.add_argument("--junit", metavar="PATH", help="JUnit XML: one test case per runner x template (with its unexpected cells) and per "
                                             "new, fixed or moved root cause")
    p.add_argument("--markdown", metavar="PATH", help="Markdown summary (GitHub step summary / PR comment)")
    p.add_argument("--badges", metavar="DIR", help="shields.io endpoint badge JSON per runner")
    p.add_argument("--html", metavar="PATH", help="static self-contained HTML report")


def add_expectations_dir(p) -> None:
    p.add_argument("--expectations", metavar="DIR", type=Path,
                   help="directory of known-divergence baselines (<runner>.json); default $CHATGOLD_EXPECTATIONS_DIR, "
                        "else for a runner the suite ships its own (conformance/expectations; `expectations update` "
                        "then needs the folder named), for a command: harness ./chatgold-expectations (never the "
                        "suite's)")


def selection_from_args(args):
    from conformance.judge.pipeline import Selection

    selection = Selection.load(args.template, args.case, args.feature, args.shard)
    if not selection.templates or not selection.cases:
        raise UserError("the selection has no cells (no template or no case matches)")
    return selection


def open_runner(spec: str, args):
    from runners import get_runner

    return get_runner(spec, workers=args.workers, timeout=args.timeout)


def add_cache_option(p) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="render every cell again instead of reusing outcomes from the result store (`chatgold "
                        "cache stats`; the fresh outcomes replace what it held), and reduce root causes afresh "
                        "without the root-cause cache")


def store_from_args(args):
    """The result store the command reads first (judge/store.py), with whether to refresh it."""
    from conformance.judge.store import ResultStore

    return ResultStore(), bool(getattr(args, "no_cache", False))


def cmd_check(args) -> int:
    from conformance.analysis.agreement import agreement_section, load_agreement
    from conformance.judge.attribution import attribute_diverged
    from conformance.judge.goldens import GoldenStore
    from conformance.judge.pipeline import GoldenJudge, requests_by_cell, run
    from conformance.report import build_report, write_outputs
    from conformance.report.render import terminal
    from conformance.service.client import ServiceError

    selection = selection_from_args(args)
    cells = selection.cells()
    # A precomputed agreement wins: no need to ask the engine again.
    agreement = load_agreement(args.capability_agreement) if args.capability_agreement else None
    goldens = GoldenStore()
    if args.service:
        from conformance.service.client import ServiceClient, ServiceJudge

        judge = ServiceJudge(ServiceClient(args.service))
    else:
        judge = GoldenJudge(goldens)
    from conformance.judge.store import CachedRunner

    store, refresh = store_from_args(args)
    runs = []
    explainer = None if args.no_explain or args.service else Explainer(args, selection, cells)
    try:
        for spec in args.runner:
            runner = open_runner(spec, args)
            try:
                runs.append(run(runner, cells, judge, args.expectations, progress_printer(spec), store, refresh))
                note_missing_baseline(runs[-1], spec)
                if explainer is not None:
                    explainer.explain(runs[-1], runner, spec)
                if agreement is None and runner.reports_capabilities():
                    agreement = agreement_section(selection.templates, CachedRunner(runner, store, refresh))
            except ServiceError as exc:
                raise UserError(str(exc)) from None
            finally:
                runner.close()
    finally:
        if explainer is not None:
            explainer.close()
    store.prune_if_needed()
    if not args.no_attribution and not args.service:
        attribute_diverged([r for one in runs for r in one.results], requests_by_cell(cells), goldens,
                           None if refresh else store)
    report = build_report(runs, selection.describe(), selection.metadata(), agreement,
                          extra_sections=analysis_sections(selection))
    print(terminal(report))
    for path in write_outputs(report, args.json, args.junit, args.markdown, args.badges, args.html):
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


class Explainer:
    """Root causes for each checked runner (conformance/explain), held against its baseline: only cells the
    baseline does not already know are explained (cached), the reference opened once for all runners."""

    def __init__(self, args, selection, cells, everything: bool = False, recording: bool = False):
        self.args, self.selection, self.cells, self.everything = args, selection, cells, everything
        self.recording = recording  # a baseline is being written: cells it knows without a cause are explained
        self.reference = None

    def explain(self, results, runner, spec: str):
        from conformance.cli.explain import describe_causes
        from conformance.explain.baseline import explain_with_baseline
        from conformance.explain.cache import ExplainCache
        from conformance.judge.pipeline import requests_by_cell
        from runners import REFERENCE_RUNNER, get_runner, is_builtin

        if self.reference is None:
            self.reference = get_runner(REFERENCE_RUNNER, workers=self.args.workers, timeout=self.args.timeout)
        explanation = explain_with_baseline(
            results, runner, self.reference, requests_by_cell(self.cells),
            cache=None if getattr(self.args, "no_cache", False) else ExplainCache(),
            families={t.id: t.family for t in self.selection.templates}, engine_builtin=is_builtin(spec),
            progress=progress_printer(f"{spec} causes", unit="groups"), everything=self.everything, explain_bare=self.recording,
            budget=getattr(self.args, "budget", None), max_groups=getattr(self.args, "max_groups", None))
        print(describe_causes(explanation, 5), file=sys.stderr)
        return explanation

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()


def cmd_expectations_update(args) -> int:
    from conformance.judge.expectations import update_expectations
    from conformance.judge.pipeline import run

    selection = selection_from_args(args)
    cells = selection.cells()
    args.expectations = update_directory(args.runner, args.expectations)
    runner = open_runner(args.runner, args)
    explainer = None if args.no_explain else Explainer(args, selection, cells, everything=args.reexplain,
                                                        recording=True)
    causes = None
    store, refresh = store_from_args(args)
    try:
        # Baselines hold byte statuses only: the token verdict is not asked for.
        results = run(runner, cells, expectations_dir=args.expectations, progress=progress_printer(args.runner),
                      store=store, refresh=refresh, tokens=False)
        if explainer is not None:
            explanation = explainer.explain(results, runner, args.runner)
            causes = {cause.id: cause.to_dict() for cause in explanation.causes}
    finally:
        runner.close()
        if explainer is not None:
            explainer.close()
    store.prune_if_needed()
    selected = None if selection.full else {c.key for c in cells}
    expectations, counts = update_expectations(results.name, results.results, selected, args.expectations, causes)
    from conformance.judge.status import describe_figure

    print(f"{results.name} {results.info.get('version', '')}: {describe_figure(results.figure())}")
    print(f"{expectations.path}: {counts['total']} known non-matching cells "
          f"({counts['added']} added, {counts['removed']} removed, {counts['changed']} changed) "
          f"from {len(cells)} {'cells (full matrix)' if selection.full else 'selected cells'}; "
          f"{counts['causes']} root causes, {counts['causes_without_reason']} without a reason yet")
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


def add_explain_options(p) -> None:
    p.add_argument("--no-explain", action="store_true",
                   help="do not look for root causes (chatgold explain) of cells the baseline does not know")
    add_reduction_limits(p)


def add_reduction_limits(p) -> None:
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="candidate renders one reduction may spend (default 1500)")
    p.add_argument("--max-groups-per-template", dest="max_groups", type=int, default=None, metavar="N",
                   help="reduce at most N (template, symptom) groups per template, the largest first; the other "
                        "groups' cells are listed unexplained (default: no limit)")


def cmd_report_merge(args) -> int:
    from conformance.report import load_report, merge_reports, write_outputs
    from conformance.report.render import terminal

    report = merge_reports(load_report(p) for p in args.inputs)
    write_outputs(report, args.output, args.junit, args.markdown, args.badges, args.html)
    print(terminal(report, show_unexpected=5))
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


def analysis_sections(selection) -> dict:
    """The stored property records of the selected templates and the suite audit, for the report."""
    from conformance.analysis.audit import run_audit
    from conformance.analysis.properties import properties_section

    selected = [t.id for t in selection.templates]
    sections = {"properties": properties_section(selected)}
    # Templates chosen by id: the audit's pairs among them only (a check of some templates says nothing of the
    # others). A shard keeps the corpus-wide audit, which `report merge` takes from any one shard.
    only = set(selected) if selection.template_globs else None
    audit = run_audit(selection.corpus.entries, [c.id for c in selection.all_cases], only=only)
    if audit["pairs"]:
        sections["audit"] = audit
    return sections


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

    report = sub.add_parser("report", help="divergence reports").add_subparsers(
        dest="report_command", metavar="ACTION", required=True)
    p = report.add_parser("merge", help="combine shard JSON reports into one and re-render the other outputs")
    p.add_argument("output", metavar="OUT.json")
    p.add_argument("inputs", nargs="+", metavar="IN.json")
    add_outputs(p)
    p.set_defaults(func=cmd_report_merge)

