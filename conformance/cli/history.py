"""`chatgold history`: an engine's conformance at several versions, and what each version introduced and fixed."""
from __future__ import annotations

import sys
import time

from conformance.cli.check import (
    add_expectations_dir,
    add_outputs,
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


def cmd_history(args) -> int:
    from conformance.analysis.history import build_history, history_lines
    from conformance.judge.goldens import GoldenStore
    from conformance.judge.pipeline import GoldenJudge, run
    from conformance.report import build_report, write_outputs
    from runners import get_runner

    versions = parse_versions(args.runner, args.versions)
    selection = selection_from_args(args)
    cells = selection.cells()
    judge = GoldenJudge(GoldenStore())
    runs, installs = [], []
    for version in versions:
        spec = f"{args.runner}@{version}"
        started = time.perf_counter()
        runner = get_runner(spec, workers=args.workers, timeout=args.timeout)  # installs on first use
        try:
            if hasattr(runner, "start"):
                runner.start()
            opened = time.perf_counter() - started
            runs.append(run(runner, cells, judge, args.expectations, progress_printer(spec)))
        finally:
            runner.close()
        installs.append({"open_seconds": round(opened, 2)})
    history = build_history(args.runner, versions, runs, installs=installs)
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
    p.add_argument("--json", metavar="PATH", help="JSON report holding every version as a runner and the history "
                                                  "section (conformance/schemas/history.schema.json)")
    p.add_argument("--history-json", metavar="PATH", help="the history section alone, as JSON")
    add_outputs(p)
    p.set_defaults(func=cmd_history)
