"""`chatgold explain`: the root cause of every non-matching cell, as a confirmed minimal reproducer, clustered
and ranked by what fixing it is worth (docs/explain.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.cli.common import EXIT_OK, UserError, progress_printer
from conformance.cli.options import (
    add_expectations_dir,
    add_reduction_limits,
    add_selection,
    open_runner,
    selection_from_args,
)
from conformance.files import ENCODING_ERRORS

EXPLAIN_TIMEOUT = 10.0


def describe_causes(explanation, limit: int = 20) -> str:
    lines = []
    stats = explanation.stats
    no_answer = stats.get("no_answer", 0)
    lines.append(f"{explanation.runner.get('name')}: {len(explanation.causes)} root cause(s) for "
                 f"{stats['cells']} failing cell(s); {len(explanation.unexplained)} unexplained"
                 + (f" ({no_answer} errored or timed out)" if no_answer else "") +
                 f" ({stats['groups']} groups: {stats['reduced']} reduced, {stats['cached']} cached; "
                 f"{stats['renders']} renders per side; {stats['seconds']:.1f} s)")
    for rank, cause in enumerate(explanation.causes[:limit], 1):
        repro = cause.repro()
        lines.append(f"{rank:3d}. {cause.id}  +{cause.gain:.2f} pts  {len(cause.cells)} cells in {cause.templates} "
                     f"template(s)  [{repro['lines']} line(s), {repro['messages']} message(s)]  {cause.title}")
    if len(explanation.causes) > limit:
        lines.append(f"     ... {len(explanation.causes) - limit} more (see --json / --html)")
    reasons: dict = {}
    for entry in explanation.unexplained:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"     unexplained: {count} cell(s): {reason[:160]}")
    return "\n".join(lines)


def write_explanation(explanation, selection, path) -> Path:
    from conformance.files import atomic_write

    data = explanation.to_dict()
    data["selection"] = selection.describe()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8", ENCODING_ERRORS))
    path.chmod(0o644)
    return path


def cmd_emit(args) -> int:
    """`--emit FORMAT`: causes of a baseline or explanation as regression tests (conformance/report/emit.py)."""
    from conformance.report.emit import emit, load_causes, write_emitted

    if args.source:
        path = Path(args.source)
    elif args.runner:
        path = Path(args.expectations or Path(__file__).resolve().parents[1] / "expectations") / \
            f"{args.runner.split('@')[0]}.json"
    else:
        raise UserError("explain --emit: give --from BASELINE_OR_EXPLANATION.json or --runner NAME")
    source = load_causes(path)
    causes = [source.find(cause_id) for cause_id in args.cause] if args.cause else source.causes[:args.top]
    runner = dict(source.runner)
    if args.engine_version:
        runner["version"] = args.engine_version
    reference = source.reference
    if args.render_reference:
        causes, reference = rerender_reference(causes, args)
    written = 0
    for cause in causes:
        files = emit(cause, args.emit, runner, reference, engine=args.emit_engine)
        if args.out:
            for written_path in write_emitted(files, args.out, force=args.force):
                print(f"wrote {written_path}", file=sys.stderr)
        else:
            for name, text in files.items():
                sys.stdout.write(f"==> {name} <==\n{text}" if len(files) > 1 or len(causes) > 1 else text)
        written += len(files)
    print(f"{len(causes)} cause(s) of {path} as {args.emit}: {written} file(s)", file=sys.stderr)
    return EXIT_OK


def rerender_reference(causes: list, args) -> tuple:
    """The causes with each reproducer's reference outcome rendered afresh by the reference runner (out of
    process), and the reference's description; a render that differs from the recorded one is said on stderr."""
    from conformance.explain.signature import outcome_record
    from runners import REFERENCE_RUNNER, get_runner
    from runners.base import Conversation, RenderRequest

    reference = get_runner(REFERENCE_RUNNER, workers=1, timeout=args.timeout)
    try:
        described = reference.describe() if hasattr(reference, "describe") else {"name": REFERENCE_RUNNER}
        fresh = []
        for cause in causes:
            repro = cause["repro"]
            request = RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), repro.get("bos_token"),
                                    repro.get("eos_token"))
            outcome = outcome_record(reference.render(request))
            if outcome != repro.get("reference"):
                print(f"{cause['id']}: the reference now gives {json.dumps(outcome, ensure_ascii=False)[:300]}, "
                      f"not the recorded outcome; emitting what it gives now", file=sys.stderr)
            fresh.append(dict(cause, repro=dict(repro, reference=outcome)))
    finally:
        reference.close()
    return fresh, described


def cmd_explain(args) -> int:
    if args.emit:
        return cmd_emit(args)
    if not args.runner:
        raise UserError("explain: --runner is required (or --emit FORMAT --from FILE)")
    from conformance.checkrun import CheckRun, ExplainOptions, Outputs

    selection = selection_from_args(args)
    options = ExplainOptions(scope="all", cache=not args.no_cache, budget=args.budget, max_groups=args.max_groups,
                             progress=lambda spec: progress_printer("explain"),
                             log=lambda line: print(line, file=sys.stderr, flush=True))
    check = CheckRun(selection.cells(), expectations_dir=args.expectations, explain=options, families={t.id: t.family for t in selection.templates},
                     workers=args.workers, timeout=args.timeout)
    with check:
        [results] = check.check_all([args.runner], lambda spec: open_runner(spec, args), progress_printer)
    explanation = results.explanation
    print(describe_causes(explanation, args.top))
    if args.json:
        print(f"wrote {write_explanation(explanation, selection, args.json)}", file=sys.stderr)
    if args.markdown or args.html:
        _, paths = check.report([results], selection, Outputs(markdown=args.markdown, html=args.html))
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("explain", help="find the root cause of every non-matching cell (minimal reproducers)",
                       description="Render the selection through the runner, then reduce every non-matching cell "
                                   "(diverged, engine-raised, engine-rendered, raised-differently) to a minimal "
                                   "template and case on which the engine still differs from the reference in the "
                                   "same way, every step a real render on both sides; cluster the reproducers into "
                                   "root causes and rank them by the conformance fixing each would gain. Reductions "
                                   "are cached (~/.cache/chatgold/explain), so a second run costs seconds.")
    p.add_argument("--runner", metavar="R",
                   help="runner spec: a name (see `chatgold engines list`) or command:'<argv>'")
    add_selection(p)
    p.set_defaults(timeout=EXPLAIN_TIMEOUT)
    add_expectations_dir(p)
    p.add_argument("--json", metavar="PATH", help="the explanation as JSON (conformance/schemas/explain.schema.json)")
    p.add_argument("--markdown", metavar="PATH", help="Markdown summary with the top causes")
    p.add_argument("--html", metavar="PATH", help="HTML report: ranked causes first, each with its reproducer")
    p.add_argument("--top", type=int, default=20, metavar="N", help="causes listed on the terminal (default 20)")
    add_reduction_limits(p)
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the reduction cache")
    from conformance.report.emit import FORMATS

    emit = p.add_argument_group("emit: a cause as a regression test in the engine's own format (docs/explain.md)")
    emit.add_argument("--emit", choices=FORMATS, metavar="FORMAT",
                      help=f"write causes as tests instead of explaining: {', '.join(FORMATS)}; no engine runs")
    emit.add_argument("--from", dest="source", metavar="PATH",
                      help="the causes: a baseline (conformance/expectations/*.json) or `explain --json` output "
                           "(default: the bundled baseline of --runner)")
    emit.add_argument("--cause", action="append", default=[], metavar="ID", help="this cause (an id or its prefix; "
                      "repeatable; default: the first --top causes)")
    emit.add_argument("--out", metavar="DIR", help="write the files here (default: print them)")
    emit.add_argument("--force", action="store_true", help="overwrite files of the same name in --out")
    emit.add_argument("--emit-engine", choices=("minijinja", "jinja2"), default=None,
                      help="pytest: the Python engine the test renders with (default: from the runner's name)")
    emit.add_argument("--engine-version", metavar="V", help="the engine version named in the emitted files")
    emit.add_argument("--render-reference", action="store_true",
                      help="render each reproducer through the reference runner (hf) for the expected output, "
                           "instead of taking the outcome recorded with the cause")
    p.set_defaults(func=cmd_explain)
