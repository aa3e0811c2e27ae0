"""The `chatgold` command line."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_RAISED, EXIT_ERRORED, EXIT_SKIPPED = 0, 1, 2, 3, 4, 5

# Modules adding their own subcommands: each has register(subparsers), and sets func=callable(args)->int.
EXTENSION_MODULES: list[str] = [
    "conformance.cli.engines",
    "conformance.cli.corpus_extra",
    "conformance.cli.check",
    "conformance.cli.service",
    "conformance.cli.capabilities",
]


class UserError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2."""


def _progress_printer(label: str, stream=sys.stderr):
    """A one-line progress bar on a terminal; silent otherwise (CI logs stay readable)."""
    if not stream.isatty():
        return None
    def show(done: int, total: int) -> None:
        if done == total or done % 50 == 0:
            width = 30
            filled = int(width * done / max(total, 1))
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            if done == total:
                stream.write("\n")
            stream.flush()
    return show


# --- corpus -------------------------------------------------------------------------------------------------

def cmd_corpus_list(args) -> int:
    from conformance.corpus.manifest import load_corpus

    corpus = load_corpus()
    entries = corpus.select(args.template)
    if args.json:
        # Each entry as in the manifest, plus which unknown special tokens its goldens depend on.
        rows = [{**e.to_dict(), "depends_on_unknown_token": corpus.depends_on_unknown_token(e)} for e in entries]
        json.dump(rows, sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    if args.constructs:
        from conformance.corpus.manifest import load_constructs

        construct_table = load_constructs(corpus.root)
    if args.capabilities:
        from conformance.analysis.capabilities import load_capabilities
    depending = 0
    for entry in entries:
        origin = entry.origins[0]
        where = origin["path"] + (f" [{origin['key']}]" if origin.get("key") else "")
        more = f" (+{len(entry.origins) - 1} more)" if len(entry.origins) > 1 else ""
        print(f"{entry.id}  sha256:{entry.sha256[:12]}  family:{entry.family}  variant:{entry.variant}"
              f"{'  generic' if entry.generic else ''}")
        if entry.former_ids:
            print(f"    aliases (former ids): {', '.join(entry.former_ids)}")
        print(f"    from {origin['source']}: {where}{more}")
        print(f"    bos={entry.bos_token!r} ({entry.bos_source})  eos={entry.eos_token!r} ({entry.eos_source})")
        print(f"    add_bos_token={_flag(entry.add_bos_token)}  add_eos_token={_flag(entry.add_eos_token)}")
        unknown = corpus.depends_on_unknown_token(entry)
        if unknown:
            depending += 1
            print(f"    goldens depend on an unknown token: {', '.join(unknown)}")
        if args.constructs:
            names = construct_table.get(entry.sha256, ["(not recorded: run `chatgold corpus build`)"])
            print(f"    constructs: {', '.join(names)}")
        if args.capabilities:
            caps = load_capabilities(entry.id)
            print(f"    capabilities: {json.dumps(caps, ensure_ascii=False, sort_keys=True) if caps else 'none recorded'}")
    unknown_entries = sum(1 for e in entries if e.unknown_tokens())
    print(f"{len(entries)} templates, {len({e.sha256 for e in entries})} unique sha256; {unknown_entries} with an "
          f"unknown bos/eos, {depending} whose goldens depend on one", file=sys.stderr)
    return EXIT_OK


def _flag(value) -> str:
    return "unknown" if value is None else str(value).lower()


def cmd_corpus_build(args) -> int:
    from conformance.corpus.manifest import build_corpus

    corpus = build_corpus(progress=lambda line: print(line, file=sys.stderr))
    print(f"corpus: {len(corpus.entries)} unique templates from {len(corpus.sources)} sources")
    return EXIT_OK


def cmd_corpus_fetch(args) -> int:
    from conformance.corpus.sources import all_sources, source_root

    for source in all_sources():
        print(f"{source.id}: {source_root(source)}")
    return EXIT_OK


def cmd_corpus_import(args) -> int:
    from conformance.corpus.manifest import import_files

    added = import_files([Path(p) for p in args.paths])
    for entry in added:
        print(f"added {entry.id} (sha256 {entry.sha256[:12]}, family {entry.family})")
    if not added:
        print("nothing new: every template is already in the corpus")
    return EXIT_OK


# --- cases --------------------------------------------------------------------------------------------------

def cmd_cases_list(args) -> int:
    from conformance.corpus.cases import load_cases, select_cases

    cases = select_cases(load_cases(), args.case, args.feature)
    if args.json:
        json.dump([c.input_dict() for c in cases], sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    for case in cases:
        print(f"{case.id}  [{', '.join(case.features)}]  {case.description}")
    print(f"{len(cases)} cases", file=sys.stderr)
    return EXIT_OK


# --- render -------------------------------------------------------------------------------------------------

def _template_from_args(args) -> tuple[str, Optional[str], Optional[str], str]:
    """(source, bos, eos, label) from --template ID or --template-file PATH (+ --bos/--eos overrides)."""
    if args.template:
        from conformance.corpus.manifest import load_corpus

        entry = load_corpus().get(args.template)
        source, bos, eos, label = entry.source(), entry.bos_token, entry.eos_token, entry.id
    else:
        from conformance.corpus.manifest import candidates_from_file

        path = Path(args.template_file)
        found = candidates_from_file(path)
        if args.template_name:
            found = [c for c in found if c.variant == args.template_name]
            if not found:
                raise UserError(f"{path}: no template named {args.template_name!r}")
        candidate = found[0]
        try:
            source = candidate.text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: template is not UTF-8 (byte {exc.start})") from None
        bos, eos, label = candidate.bos_token, candidate.eos_token, str(path)
    if args.bos is not None:
        bos = args.bos
    if args.eos is not None:
        eos = args.eos
    return source, bos, eos, label


def _case_from_args(args):
    from conformance.corpus.cases import CASES_DIR, load_case

    if args.case:
        path = CASES_DIR / f"{args.case}.json"
        if not path.exists():
            raise UserError(f"unknown case id {args.case!r} (see `chatgold cases list`)")
        return load_case(path)
    return load_case(Path(args.case_file), check_name=False)


def cmd_render(args) -> int:
    from runners import get_runner

    source, bos, eos, label = _template_from_args(args)
    case = _case_from_args(args)
    request = case.request(source, bos, eos, template_id=label)
    runner = get_runner(args.runner)
    try:
        outcome = runner.render(request)
    finally:
        runner.close()
    if outcome.kind == "rendered":
        sys.stdout.buffer.write(outcome.text.encode("utf-8", "surrogatepass"))
        sys.stdout.flush()
        return EXIT_OK
    if outcome.kind == "raised":
        print(outcome.message, file=sys.stderr)
        return EXIT_RAISED
    if outcome.kind == "skipped":
        print(f"skipped: {outcome.reason}", file=sys.stderr)
        return EXIT_SKIPPED
    print(f"runner error: {outcome.message}", file=sys.stderr)
    if outcome.detail:
        print(outcome.detail, file=sys.stderr)
    return EXIT_ERRORED


# --- goldens ------------------------------------------------------------------------------------------------

def reference_versions() -> dict:
    from runners.hf import transformers_versions

    return {**transformers_versions(), "python_runner": "runners.hf", "note": "goldens are byte-exact outputs of these versions"}


def cmd_goldens_update(args) -> int:
    from runners import REFERENCE_RUNNER, get_runner

    from conformance.corpus.cases import load_cases, select_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.judge.goldens import update_goldens, write_meta

    corpus = load_corpus()
    templates = corpus.select(args.template)
    all_cases = load_cases()
    cases = select_cases(all_cases, args.case)
    full = not args.template and not args.case
    runner = get_runner(REFERENCE_RUNNER, workers=args.workers)
    try:
        report = update_goldens(templates, cases, runner, prune=full, full=full,
                                progress=_progress_printer("goldens"))
        from conformance.analysis.capabilities import update_capability_goldens

        caps_written, caps_failures = update_capability_goldens(templates, runner)
        print(f"capabilities: {len(templates)} templates, {caps_written} written")
        report.failures.extend((t, "capabilities.json", m) for t, m in caps_failures)
    finally:
        runner.close()
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


def cmd_harness_validate(args) -> int:
    from runners.protocol.validate import main as validate_main

    return validate_main(args.rest)


# --- parser -------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatgold",
        description="Conformance suite and golden files for LLM chat templates. Goldens are the byte-exact "
                    "output of HuggingFace transformers' apply_chat_template; runners render the same "
                    "templates x cases through other engines and the report says where they diverge.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    corpus = sub.add_parser("corpus", help="the template corpus (templates/)").add_subparsers(
        dest="corpus_command", metavar="ACTION", required=True)
    p = corpus.add_parser("list", help="list templates with provenance, aliases, bos/eos evidence and unknown-token dependence")
    p.add_argument("--template", action="append", metavar="GLOB", help="only ids matching GLOB (repeatable)")
    p.add_argument("--json", action="store_true", help="print manifest entries as JSON")
    p.add_argument("--constructs", action="store_true", help="also list each template's Jinja constructs")
    p.add_argument("--capabilities", action="store_true", help="also show each template's capability golden")
    p.set_defaults(func=cmd_corpus_list)
    p = corpus.add_parser("build", help="re-create the corpus from its pinned sources (downloads into the cache)")
    p.set_defaults(func=cmd_corpus_build)
    p = corpus.add_parser("fetch", help="download and verify every pinned source into the cache (no corpus change)")
    p.set_defaults(func=cmd_corpus_fetch)
    p = corpus.add_parser("import", help="add templates from .jinja, tokenizer_config.json, chat_template.json or .gguf files")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_corpus_import)

    cases = sub.add_parser("cases", help="the conversation cases").add_subparsers(
        dest="cases_command", metavar="ACTION", required=True)
    p = cases.add_parser("list", help="list cases with their feature tags")
    p.add_argument("--case", action="append", metavar="GLOB")
    p.add_argument("--feature", action="append", metavar="TAG")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cases_list)

    p = sub.add_parser("render", help="render one template x case; writes exactly the rendered bytes to stdout",
                       description="Writes exactly the rendered bytes to stdout. Exit 3: the template raised "
                                   "(message on stderr); 4: the runner failed; 5: the runner skipped the cell.")
    p.add_argument("--runner", default="hf", help="runner name (default: hf, the reference)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--template", metavar="ID", help="corpus template id")
    src.add_argument("--template-file", metavar="PATH", help=".jinja, tokenizer_config.json, chat_template.json or .gguf")
    p.add_argument("--template-name", metavar="NAME", help="named variant inside the file (tool_use, rag, ...)")
    p.add_argument("--bos", metavar="TEXT", help="bos_token text (overrides the file's)")
    p.add_argument("--eos", metavar="TEXT", help="eos_token text (overrides the file's)")
    case = p.add_mutually_exclusive_group(required=True)
    case.add_argument("--case", metavar="ID", help="case id")
    case.add_argument("--case-file", metavar="PATH", help="a case JSON file")
    p.set_defaults(func=cmd_render)

    goldens = sub.add_parser("goldens", help="the reference's goldens (goldens/)").add_subparsers(
        dest="goldens_command", metavar="ACTION", required=True)
    p = goldens.add_parser("update", help="regenerate goldens with the reference runner")
    p.add_argument("--template", action="append", metavar="GLOB")
    p.add_argument("--case", action="append", metavar="GLOB")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_goldens_update)
    p = goldens.add_parser("orphans", help="list goldens that no (template, case) pair produces")
    p.set_defaults(func=cmd_goldens_orphans)

    harness = sub.add_parser("harness", help="engine harnesses speaking the protocol (runners/protocol)").add_subparsers(
        dest="harness_command", metavar="ACTION", required=True)
    p = harness.add_parser("validate", help="drive a harness with probe renders and check every message against the schemas",
                           description="chatgold harness validate [--timeout S] -- <harness argv...>")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- ARGV", help="options, then -- and the harness command line")
    p.set_defaults(func=cmd_harness_validate)

    for name in EXTENSION_MODULES:
        importlib.import_module(name).register(sub)
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
        print(f"chatgold: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("chatgold: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
