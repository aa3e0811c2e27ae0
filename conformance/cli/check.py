"""`chatgold check`, `chatgold expectations update`, `chatgold report merge`: the divergence report."""
from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL = 0, 1


def select_matrix(template_globs=None, case_globs=None, features=None, shard=None):
    """(templates, cases, full?) for a selection; shard 'I/N' keeps whole templates together."""
    from conformance.corpus.cases import load_cases, select_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.judge.pipeline import shard_of

    corpus = load_corpus()
    templates = corpus.select(template_globs or None)
    cases = select_cases(load_cases(), case_globs or None, features or None)
    if shard:
        try:
            index, count = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ValueError(f"--shard {shard!r}: expected I/N, e.g. 2/4") from None
        if not 1 <= index <= count:
            raise ValueError(f"--shard {shard}: I must be between 1 and N")
        templates = [t for t in templates if shard_of(t.id, count) == index - 1]
    full = not (template_globs or case_globs or features or shard)
    return templates, cases, full


def section_for(runner_name: str, runner_info: dict, cells: list, outcomes, progress=None, attribute=True,
                expectations_dir=None) -> tuple[dict, list]:
    """Classify one runner's outcomes (or render them when `outcomes` is None) into a report section."""
    from conformance.judge.status import check_cells
    from conformance.judge.expectations import load_expectations
    from conformance.report import runner_section

    results = check_cells(runner_name, cells, progress=progress, attribute=attribute, outcomes=outcomes)
    templates = {c.template.id: c.template for c in cells}
    cases = {c.case.id: c.case for c in cells}
    section = runner_section(runner_info, results, load_expectations(runner_name, expectations_dir), templates, cases)
    return section, results


def render_and_check(spec: str, cells: list, workers: int, progress=None, attribute=True, expectations_dir=None):
    section, results, _ = run_runner(spec, cells, workers, progress, attribute, expectations_dir)
    return section, results


def run_runner(spec: str, cells: list, workers: int, progress=None, attribute=True, expectations_dir=None,
               service_client=None, agreement_templates=None):
    """(section, results, capability agreement or None) for one runner over `cells`.

    service_client: judge each rendered cell through a `chatgold serve` instead of the local goldens.
    agreement_templates: when the runner is llama.cpp, also compute its capability agreement over these
    templates while its servers are still up."""
    from runners import get_runner

    from conformance.report import capability_agreement, runner_section, supports_capability_agreement

    runner = get_runner(spec, workers=workers)
    agreement = None
    try:
        outcomes = list(_with_progress(runner.render_many([c.request for c in cells]), len(cells), progress))
        info = runner.describe()
        name = runner.name
        if agreement_templates is not None and supports_capability_agreement(runner):
            agreement = capability_agreement(agreement_templates, runner)
    finally:
        runner.close()
    if service_client is None:
        section, results = section_for(name, info, cells, outcomes, attribute=attribute,
                                       expectations_dir=expectations_dir)
        return section, results, agreement
    from conformance.cli.service import judge_through_service
    from conformance.judge.expectations import load_expectations

    results = judge_through_service(service_client, name,
                                    [(c.template.id, c.case.id, o) for c, o in zip(cells, outcomes)], attribute)
    section = runner_section(info, results, load_expectations(name, expectations_dir),
                             {c.template.id: c.template for c in cells}, {c.case.id: c.case for c in cells})
    return section, results, agreement


def _with_progress(outcomes, total, progress):
    for index, outcome in enumerate(outcomes, 1):
        if progress:
            progress(index, total)
        yield outcome


def _selection(args) -> dict:
    return {"templates": args.template or [], "cases": args.case or [], "features": args.feature or [],
            "shard": args.shard}


def cmd_check(args) -> int:
    from conformance.cli import _progress_printer
    from conformance.service.client import ServiceClient, ServiceError
    from conformance.judge.pipeline import iter_cells
    from conformance.report import build_report, load_capability_agreement, write_outputs
    from conformance.report.render import terminal

    templates, cases, _ = select_matrix(args.template, args.case, args.feature, args.shard)
    cells = list(iter_cells(templates, cases))
    if not cells:
        print("chatgold: error: the selection has no cells", file=sys.stderr)
        return 2
    # A precomputed summary wins: no need to ask llama.cpp again.
    agreement = load_capability_agreement(args.capability_agreement) if args.capability_agreement else None
    client = ServiceClient(args.service) if args.service else None
    sections = {}
    for spec in args.runner:
        try:
            section, _, computed = run_runner(spec, cells, args.workers, _progress_printer(spec),
                                              attribute=not args.no_attribution, service_client=client,
                                              agreement_templates=templates if agreement is None else None)
        except ServiceError as exc:
            print(f"chatgold: error: {exc}", file=sys.stderr)
            return 2
        agreement = agreement or computed
        sections[section["runner"].get("name", spec)] = section
    selection = _selection(args)
    selection.update(template_count=len(templates), case_count=len(cases))
    report = build_report(sections, selection, agreement)
    print(terminal(report))
    for path in write_outputs(report, args.json, args.junit, args.markdown, args.badges, args.html):
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


def cmd_expectations_update(args) -> int:
    from conformance.judge.status import check_cells
    from conformance.cli import _progress_printer
    from conformance.judge.expectations import update_expectations
    from conformance.judge.pipeline import iter_cells
    from runners import get_runner

    templates, cases, full = select_matrix(args.template, args.case, args.feature, args.shard)
    cells = list(iter_cells(templates, cases))
    runner = get_runner(args.runner, workers=args.workers)
    try:
        results = check_cells(runner, cells, progress=_progress_printer(args.runner), attribute=False)
        name = runner.name
    finally:
        runner.close()
    selected = None if full else {(c.template.id, c.case.id) for c in cells}
    expectations, counts = update_expectations(name, results, selected)
    print(f"{expectations.path}: {counts['total']} known non-matching cells "
          f"({counts['added']} added, {counts['removed']} removed, {counts['changed']} changed) "
          f"from {len(cells)} {'cells (full matrix)' if full else 'selected cells'}")
    return EXIT_OK


def cmd_report_merge(args) -> int:
    from conformance.report import load_report, merge_reports, write_outputs
    from conformance.report.render import terminal

    report = merge_reports(load_report(p) for p in args.inputs)
    write_outputs(report, args.output, args.junit, args.markdown, args.badges, args.html)
    print(terminal(report, show_unexpected=5))
    return EXIT_FAIL if report["unexpected"] else EXIT_OK


def _add_outputs(p) -> None:
    p.add_argument("--junit", metavar="PATH", help="JUnit XML, one test case per cell")
    p.add_argument("--markdown", metavar="PATH", help="Markdown summary (GitHub step summary / PR comment)")
    p.add_argument("--badges", metavar="DIR", help="shields.io endpoint badge JSON per runner")
    p.add_argument("--html", metavar="PATH", help="static self-contained HTML report")


def _add_selection(p) -> None:
    p.add_argument("--template", action="append", metavar="GLOB", help="template ids to include (repeatable)")
    p.add_argument("--case", action="append", metavar="GLOB", help="case ids to include (repeatable)")
    p.add_argument("--feature", action="append", metavar="TAG", help="only cases with this feature tag")
    p.add_argument("--shard", metavar="I/N", help="shard I of N (whole templates per shard)")
    p.add_argument("--workers", type=int, default=2, help="engine processes per runner (default 2)")


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="check engines against the goldens and report divergences",
                              description="Exit 1 when any cell is not as its runner's expectations say "
                                          "(conformance/expectations/<runner>.json).")
    p.add_argument("--runner", action="append", required=True, metavar="R", help="runner spec (repeatable)")
    _add_selection(p)
    p.add_argument("--json", metavar="PATH", help="JSON report (conformance/schemas/report.schema.json)")
    _add_outputs(p)
    p.add_argument("--no-attribution", action="store_true",
                   help="skip the evaluator's byte provenance for diverged cells")
    p.add_argument("--service", metavar="URL",
                   help="judge each rendered cell through a `chatgold serve` (which holds the goldens) instead of "
                        "the local goldens; errors, timeouts and skips stay local")
    p.add_argument("--capability-agreement", metavar="PATH",
                   help="include this llama.cpp capability agreement summary (`chatgold capabilities compare "
                        "--out`) instead of computing it when the llamacpp runner takes part")
    p.set_defaults(func=cmd_check)

    expectations = subparsers.add_parser("expectations", help="known divergences per engine").add_subparsers(
        dest="expectations_command", metavar="ACTION", required=True)
    p = expectations.add_parser("update", help="rewrite a runner's baseline from a fresh run (a selection "
                                               "updates only the selected cells)")
    p.add_argument("--runner", required=True, metavar="R")
    _add_selection(p)
    p.set_defaults(func=cmd_expectations_update)

    report = subparsers.add_parser("report", help="divergence reports").add_subparsers(
        dest="report_command", metavar="ACTION", required=True)
    p = report.add_parser("merge", help="combine shard JSON reports into one and re-render the other outputs")
    p.add_argument("output", metavar="OUT.json")
    p.add_argument("inputs", nargs="+", metavar="IN.json")
    _add_outputs(p)
    p.set_defaults(func=cmd_report_merge)
