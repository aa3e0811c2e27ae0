"""Check one engine's harness against the chatgold goldens; the step the reusable workflow runs.

Reads HARNESS_COMMAND (the harness argv, as a shell-quoted string), TEMPLATES and CASES (space-separated id
globs; empty = all) from the environment, so the workflow never interpolates caller input into a script.
Writes <reports>/report.json (every cell), summary.md (for the job summary) and badge.json (a shields.io
endpoint document), and exits 1 when any cell neither matches nor is skipped by the engine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from conformance.cases import load_cases, select_cases
from conformance.check import PASSING, SKIPPED, check_cells, summarize
from conformance.corpus import load_corpus
from conformance.matrix import iter_cells
from runners import get_runner

# Statuses that do not fail an engine's PR: a match, a shared refusal, a declared "cannot express this".
NOT_FAILING = PASSING | {SKIPPED}


def badge(summary: dict) -> dict:
    percent = summary["conformance"]
    if percent is None:
        return {"schemaVersion": 1, "label": "chatgold", "message": "no cells", "color": "lightgrey"}
    color = "brightgreen" if percent >= 99.5 else "green" if percent >= 95 else "yellow" if percent >= 80 else "red"
    return {"schemaVersion": 1, "label": "chatgold", "color": color,
            "message": f"{percent:g}% ({summary['passed']}/{summary['cells']})"}


def markdown(spec: str, summary: dict, failing: list, seconds: float) -> str:
    lines = [f"## chatgold conformance: `{spec}`", "",
             f"{summary['passed']} of {summary['cells']} cells pass ({summary['conformance']}%) in {seconds:.1f} s.", "",
             "| status | cells |", "| --- | ---: |"]
    lines += [f"| {status} | {count} |" for status, count in summary["counts"].items() if count]
    if failing:
        lines += ["", f"First failing cells ({len(failing)} in all):", ""]
        lines += [f"- `{r.key}`: {r.status}" + (f" at byte {r.divergence.offset}" if r.divergence else "")
                  for r in failing[:20]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", default="reports", help="directory for report.json, summary.md, badge.json")
    args = parser.parse_args(argv)
    command = os.environ.get("HARNESS_COMMAND", "").strip()
    if not command:
        print("engine_check: HARNESS_COMMAND is empty: pass the harness argv as the harness-command input",
              file=sys.stderr)
        return 2
    template_globs = os.environ.get("TEMPLATES", "").split() or None
    case_globs = os.environ.get("CASES", "").split() or None
    spec = f"command:{command}"
    templates = load_corpus().select(template_globs)
    cases = select_cases(load_cases(), case_globs)
    cells = list(iter_cells(templates, cases))
    started = time.perf_counter()
    runner = get_runner(spec)
    try:
        results = check_cells(runner, cells)
    finally:
        runner.close()
    seconds = time.perf_counter() - started
    summary = summarize(results)
    failing = [r for r in results if r.status not in NOT_FAILING]
    out = Path(args.reports)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(
        {"runner": spec, "summary": summary, "seconds": round(seconds, 3),
         "cells": [r.to_dict() for r in results]}, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "summary.md").write_text(markdown(spec, summary, failing, seconds), encoding="utf-8")
    (out / "badge.json").write_text(json.dumps(badge(summary)), encoding="utf-8")
    print(f"engine_check: {summary['passed']}/{summary['cells']} cells pass, {len(failing)} failing "
          f"({seconds:.1f} s); reports in {out}/")
    return 1 if failing or not results else 0


if __name__ == "__main__":
    sys.exit(main())
