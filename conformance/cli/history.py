"""`chatgold history`: an engine's conformance at several versions, and what each version introduced and fixed."""
from __future__ import annotations

import sys
import time

from conformance.cli.common import EXIT_OK, UserError, progress_printer
from conformance.cli.options import (
    add_expectations_dir,
    add_outputs,
    add_reduction_limits,
    add_selection,
    selection_from_args,
)


def parse_versions(runner: str, text: str) -> list:
    """'2.9.0,2.10.2' -> normalised versions in the order given (oldest first), without duplicates."""
    from runners import VERSIONED_RUNNERS, normalise_version

    if runner not in VERSIONED_RUNNERS:
        raise UserError(f"--runner {runner}: no versions to compare; versioned runners: "
                        f"{', '.join(sorted(VERSIONED_RUNNERS))}")
    versions = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            version = normalise_version(runner, item)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if version in versions:
            raise UserError(f"--versions: {item} is given twice")
        versions.append(version)
    if len(versions) < 2:
        raise UserError("--versions: give at least two versions, oldest first (e.g. 2.9.0,2.10.2)")
    return versions


def changed_causes(runs: list, versions: list) -> dict:
    """cause id -> what the history shows of it (title, constructs, reproducer, the versions it explains)."""
    causes: dict = {}
    for version, run in zip(versions, runs):
        if run.explanation is None:
            continue
        for cause in run.explanation.causes:
            repro = cause.repro()
            causes.setdefault(cause.id, {"title": cause.title, "constructs": list(cause.constructs),
                                         "template": repro["template"], "versions": []})
            causes[cause.id]["versions"].append(version)
    return causes


def root_cause_of(result) -> str:
    """A cell's root cause id (recorded by explain_changes), or its signature when it was not explained."""
    from conformance.analysis.history import signature

    cause = result.cause
    return cause if cause else f"unexplained: {signature(result)}"


def cmd_history(args) -> int:
    from conformance.analysis.history import build_history, history_lines, involved_cells, signature
    from conformance.checkrun import CheckRun, ExplainOptions, Outputs
    from runners import get_runner

    versions = parse_versions(args.runner, args.versions)
    selection = selection_from_args(args)
    root = args.causes == "root"
    options = None
    if root:  # the cells each change involves, reduced to root causes (cached), version by version
        options = ExplainOptions(scope="all", cache=not args.no_cache, budget=args.budget,
                                 max_groups=args.max_groups, progress=lambda spec: progress_printer(f"{spec} causes"))
    check = CheckRun(selection.cells(), expectations_dir=args.expectations, explain=options,
                     families={t.id: t.family for t in selection.templates}, workers=args.workers,
                     timeout=args.timeout)
    installs = []

    def open_version(spec):
        started = time.perf_counter()
        runner = get_runner(spec, workers=args.workers, timeout=args.timeout)  # installs on first use
        try:
            if hasattr(runner, "start"):
                runner.start()
        except BaseException:
            runner.close()
            raise
        installs.append({"open_seconds": round(time.perf_counter() - started, 2)})
        return runner

    specs = [f"{args.runner}@{version}" for version in versions]
    with check:
        runs = check.check_all(specs, open_version, progress_printer,
                               explain_changes=involved_cells if root else None)
    if root:
        history = build_history(args.runner, versions, runs, cause_of=root_cause_of, cause_kind="root",
                                installs=installs, causes=changed_causes(runs, versions))
    else:
        history = build_history(args.runner, versions, runs, cause_of=signature, installs=installs)
    for line in history_lines(history):
        print(line)
    outputs = Outputs.from_args(args)
    if outputs.any():
        _, paths = check.report(runs, selection, outputs, extra_sections={"history": history})
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    if args.history_json:
        import json
        from pathlib import Path

        target = Path(args.history_json)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(history, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("history", help="an engine's conformance across its versions (what each one fixed and broke)",
                       description="Render the selection through NAME@V for every version given (each installed "
                                   "into the cache on first use), judge every cell against the goldens, and report "
                                   "the conformance per version, the causes introduced and fixed between "
                                   "consecutive versions, and the first version that renders each template right.")
    p.add_argument("--runner", required=True, metavar="NAME",
                   help="a versioned runner: minijinja, hf, hfjs, llamacpp, llama-cpp-python")
    p.add_argument("--versions", required=True, metavar="V1,V2,...", help="versions to compare, oldest first")
    add_selection(p)
    add_expectations_dir(p)
    p.add_argument("--causes", choices=("root", "signature"), default="root",
                   help="group the cells a change involves by root cause (chatgold explain reduces each to a "
                        "confirmed minimal reproducer; cached), or by signature (status and normalised message or "
                        "first edit: no extra renders). Default: root")
    add_reduction_limits(p)
    p.add_argument("--no-cache", action="store_true", help="reduce root causes afresh, without the root-cause cache")
    p.add_argument("--json", metavar="PATH", help="JSON report holding every version as a runner and the history "
                                                  "section (conformance/schemas/history.schema.json)")
    p.add_argument("--history-json", metavar="PATH", help="the history section alone, as JSON")
    add_outputs(p)
    p.set_defaults(func=cmd_history)
