"""The `chatgold` command line: one module per subject, each with register(subparsers)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional

from conformance.cli.common import (
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UserError,
)

# Subjects, in the order `chatgold --help` lists them; each module sets func=callable(args) -> exit code.
SUBJECTS = ("corpus", "cases", "render", "goldens", "check", "explain", "history", "capabilities", "properties",
            "lint", "compat", "service", "harness", "engines", "cache", "site")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatgold", epilog=EXIT_CODES_HELP,
        description="Conformance suite and golden files for LLM chat templates. Goldens are the byte-exact "
                    "output of HuggingFace transformers' apply_chat_template; runners render the same "
                    "templates x cases through other engines and the report says where they diverge and why.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBJECTS:
        importlib.import_module(f"conformance.cli.{name}").register(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    from conformance.corpus.cases import CaseError
    from conformance.corpus.manifest import CorpusError
    from runners.base import RunnerUnavailable
    from runners.gguf_header import GGUFHeaderError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or EXIT_OK
    except (UserError, CaseError, CorpusError, GGUFHeaderError, RunnerUnavailable, ValueError) as exc:
        print(f"chatgold: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path the user gave: missing, a directory, unreadable
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"chatgold: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError:
        print("chatgold: error: the input nests too deeply to process", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("chatgold: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of chatgold's own: one line, not a traceback, unless asked for
        if os.environ.get("CHATGOLD_DEBUG"):
            raise
        print(f"chatgold: internal error: {type(exc).__name__}: {_one_line(exc)} (CHATGOLD_DEBUG=1 shows the "
              f"traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 2000 else text[:2000] + " ..."


if __name__ == "__main__":
    sys.exit(main())
