"""`chatgold history`: an engine's conformance at several versions, and what each version introduced and fixed."""
from __future__ import annotations

import sys
import time

from conformance.cli.check import (
    add_expectations_dir,
    add_outputs,
    add_reduction_limits,
    add_selection,
    selection_from_args,
)
from conformance.cli.common import EXIT_OK, UserError, progress_printer


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


class ChangeExplainer:
    """Reduces the cells each change involves to root causes (chatgold explain, cached), version by version,
    recording each explained cell's cause id on its result. A version's cells can be explained once the next
    version is rendered (a change involves both neighbours), so its runner is handed over still open and closed
    here: no version is started twice."""

    def __init__(self, args, selection, cells):
        self.args, self.selection, self.cells = args, selection, cells
        self.causes: dict = {}   # cause id -> what the history shows of it
        self.reference = None

    def explain(self, runs: list, versions: list, index: int, engine) -> None:
        from conformance.analysis.history import involved_cells
        from conformance.cli.explain import explain_run
        from runners import REFERENCE_RUNNER, get_runner

        args, version = self.args, versions[index]
        spec = f"{args.runner}@{version}"
        try:
            only = involved_cells(runs, index)
            if not only:
                return
            if self.reference is None:
                self.reference = get_runner(REFERENCE_RUNNER, workers=args.workers, timeout=args.timeout)
            explanation = explain_run(runs[index], engine, self.reference, self.selection, self.cells, spec,
                                      cache=not args.no_cache, budget=args.budget, only=only,
                                      max_groups=args.max_groups, progress=progress_printer(f"{spec} causes"))
        finally:
            engine.close()
        for cause in explanation.causes:
            repro = cause.repro()
            self.causes.setdefault(cause.id, {"title": cause.title, "constructs": list(cause.constructs),
                                              "template": repro["template"], "versions": []})
            self.causes[cause.id]["versions"].append(version)

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()


def root_cause_of(result) -> str:
    """A cell's root cause id (recorded by explain_changes), or its signature when it was not explained."""
    from conformance.analysis.history import signature

    cause = result.extra.get("cause")
    return cause if cause else f"unexplained: {signature(result)}"


def cmd_history(args) -> int:
    from conformance.analysis.history import build_history, history_lines, signature
    from conformance.judge.goldens import GoldenStore
    from conformance.judge.pipeline import GoldenJudge, run
    from conformance.report import build_report, write_outputs
    from runners import get_runner

    versions = parse_versions(args.runner, args.versions)
    selection = selection_from_args(args)
    cells = selection.cells()
    judge = GoldenJudge(GoldenStore())
    runs, installs = [], []
    explainer = ChangeExplainer(args, selection, cells) if args.causes == "root" else None
    waiting = None   # the previous version's runner, open until its cells are explained
    try:
        for index, version in enumerate(versions):
            spec = f"{args.runner}@{version}"
            started = time.perf_counter()
            runner = get_runner(spec, workers=args.workers, timeout=args.timeout)  # installs on first use
            try:
                if hasattr(runner, "start"):
                    runner.start()
                opened = time.perf_counter() - started
                runs.append(run(runner, cells, judge, args.expectations, progress_printer(spec)))
            except BaseException:
                runner.close()
                raise
            installs.append({"open_seconds": round(opened, 2)})
            if explainer is None:
                runner.close()
                continue
            previous, waiting = waiting, runner
            if previous is not None:
                explainer.explain(runs, versions, index - 1, previous)   # closes it
        if waiting is not None:
            last, waiting = waiting, None
            explainer.explain(runs, versions, len(versions) - 1, last)   # closes it
    finally:
        if waiting is not None:
            waiting.close()
        if explainer is not None:
            explainer.close()
    if explainer is not None:
        history = build_history(args.runner, versions, runs, cause_of=root_cause_of, cause_kind="root",
                                installs=installs, causes=explainer.causes)
    else:
        history = build_history(args.runner, versions, runs, cause_of=signature, installs=installs)
    for line in history_lines(history):
        print(line)
    if args.json or args.html or args.markdown or args.junit or args.badges:
        report = build_report(runs, selection.describe(), selection.metadata(), extra_sections={"history": history})
        for path in write_outputs(report, args.json, args.junit, args.markdown, args.badges, args.html):
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
