"""`chatgold render`: one template x one case through one runner; exactly the rendered bytes on stdout."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from conformance.cli.common import (
    EXIT_ERRORED,
    EXIT_OK,
    EXIT_RAISED,
    EXIT_SKIPPED,
    UserError,
)
from conformance.files import ENCODING_ERRORS
from runners.base import MAX_TEMPLATE_BYTES


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
        if len(candidate.text) > MAX_TEMPLATE_BYTES:
            raise UserError(f"{path}: the template is {len(candidate.text)} bytes, over the limit of "
                            f"{MAX_TEMPLATE_BYTES} bytes (the largest real chat template is under 50 KB)")
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
    return load_case(Path(args.case_file), check_name=False, minimal=True)


def cmd_render(args) -> int:
    from runners import get_runner

    if args.cause:
        from conformance.cli.replay import replay_cause

        if args.case or args.case_file:
            raise UserError("--cause replays the cause's own conversation: give no --case/--case-file")
        outcome = replay_cause(args)
    else:
        if not (args.case or args.case_file):
            raise UserError("give --case ID or --case-file PATH (or --cause ID to replay a baseline's cause)")
        source, bos, eos, label = _template_from_args(args)
        case = _case_from_args(args)
        request = case.request(source, bos, eos, template_id=label)
        runner = get_runner(args.runner)
        try:
            outcome = runner.render(request)
        finally:
            runner.close()
    if outcome.kind == "rendered":
        sys.stdout.buffer.write(outcome.text.encode("utf-8", ENCODING_ERRORS))
        sys.stdout.flush()
        return EXIT_OK
    if outcome.kind == "raised":
        print(outcome.message, file=sys.stderr)
        return EXIT_RAISED
    if outcome.kind == "skipped":
        print(f"skipped: {outcome.message}", file=sys.stderr)
        return EXIT_SKIPPED
    print(f"runner error: {outcome.message}", file=sys.stderr)
    if outcome.detail:
        print(outcome.detail, file=sys.stderr)
    return EXIT_ERRORED


def register(sub) -> None:
    p = sub.add_parser("render", help="render one template x case; writes exactly the rendered bytes to stdout",
                       description="Writes exactly the rendered bytes to stdout. Exit 3: the template raised "
                                   "(message on stderr); 4: the runner failed; 5: the runner skipped the cell.")
    p.add_argument("--runner", default="hf", metavar="R",
                   help="runner spec: a name (see `chatgold engines list`; default hf, the reference), NAME@VERSION, "
                        "or command:'<argv>' for your own harness")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--template", metavar="ID", help="corpus template id")
    src.add_argument("--cause", metavar="ID",
                     help="replay a root cause's minimal reproducer from the runner's baseline (template, case and "
                          "special tokens); stderr shows what the baseline recorded on both sides")
    src.add_argument("--template-file", metavar="PATH", help=".jinja, tokenizer_config.json, chat_template.json or .gguf")
    p.add_argument("--template-name", metavar="NAME", help="named variant inside the file (tool_use, rag, ...)")
    p.add_argument("--bos", metavar="TEXT", help="bos_token text (overrides the file's)")
    p.add_argument("--eos", metavar="TEXT", help="eos_token text (overrides the file's)")
    p.add_argument("--expectations", metavar="DIR", type=Path,
                   help="with --cause: the baselines folder (as for `chatgold check`)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--case", metavar="ID", help="case id")
    case.add_argument("--case-file", metavar="PATH",
                      help="a JSON file holding one conversation: only `messages` is required; `tools`, `documents`, "
                           "`add_generation_prompt`, `continue_final_message`, `kwargs` and `now` are optional "
                           "(runners/protocol/conversation.schema.json; a `now` without an offset is read as UTC); "
                           "id, description and features are ignored")
    p.set_defaults(func=cmd_render)
