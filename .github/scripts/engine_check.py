"""The reusable workflow's check step: `chatgold check` on one engine harness, inputs read from the environment.

HARNESS_COMMAND (the harness argv, shell-quoted), TEMPLATES and CASES (space-separated id globs; empty = all)
and EXPECTATIONS_DIR (the engine's own known-divergence baselines; optional) come from the environment so
the workflow never interpolates caller input into a script. Writes report.json, report.html, summary.md,
junit.xml and badges/ under --reports; the exit status is `chatgold check`'s (1 on unexpected outcomes).
"""
from __future__ import annotations

import argparse
import os
import sys

from conformance.cli import main as chatgold


def check_argv(reports: str, environ=os.environ) -> list:
    command = environ.get("HARNESS_COMMAND", "").strip()
    if not command:
        raise SystemExit("engine_check: HARNESS_COMMAND is empty: pass the harness argv as the harness-command input")
    argv = ["check", "--runner", f"command:{command}",
            "--json", f"{reports}/report.json", "--html", f"{reports}/report.html",
            "--markdown", f"{reports}/summary.md", "--junit", f"{reports}/junit.xml", "--badges", f"{reports}/badges"]
    for glob in environ.get("TEMPLATES", "").split():
        argv += ["--template", glob]
    for glob in environ.get("CASES", "").split():
        argv += ["--case", glob]
    if environ.get("EXPECTATIONS_DIR"):  # the engine's own baselines, in its own repository
        argv += ["--expectations", os.path.abspath(environ["EXPECTATIONS_DIR"])]
    return argv


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", default="reports", help="directory for the report files")
    args = parser.parse_args(argv)
    try:
        check = check_argv(args.reports)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    os.makedirs(args.reports, exist_ok=True)
    return chatgold(check)


if __name__ == "__main__":
    sys.exit(main())
