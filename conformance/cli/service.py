"""`chatgold serve`, `remote-check`, `export`, `identify`: the golden-file service and what reads from it."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError, progress_printer


def cmd_serve(args) -> int:
    import os

    from conformance.service.server import (
        DEFAULT_RATE,
        LOOPBACK_HOSTS,
        TOKEN_ENV,
        serve,
    )

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.host not in LOOPBACK_HOSTS:
        if not token:
            raise UserError(f"--host {args.host} makes the service reachable beyond this machine: it then needs "
                            f"a token (--token TOKEN or {TOKEN_ENV}); clients send `Authorization: Bearer TOKEN`")
        print(f"chatgold: warning: binding {args.host}: the service is reachable beyond this machine (token "
              f"required, {args.rate_limit or DEFAULT_RATE:g} requests/s per client)", file=sys.stderr)
    serve(args.host, args.port, ready_file=args.ready_file, token=token, rate_limit=args.rate_limit)
    return EXIT_OK


def cmd_remote_check(args) -> int:
    """Render locally through a runner, templates and cases from a service, which judges every cell."""
    from conformance.corpus.cases import case_from_data
    from conformance.checkrun import CheckRun
    from conformance.judge.pipeline import Cell
    from conformance.judge.status import describe_figure
    from conformance.service.client import ServiceClient, ServiceError, ServiceJudge
    from runners import get_runner

    client = ServiceClient(args.service)
    try:
        templates = client.templates(args.template)
        cases = [case_from_data(c, f"{args.service} case {c['id']}") for c in client.cases(args.case)]
        if not templates or not cases:
            raise UserError("the selection is empty (no template or no case matches)")
        cells = []
        for summary in templates:
            source = client.template(summary["id"])["source"]
            template = SimpleNamespace(id=summary["id"])  # the pipeline reads only the id of a cell's template
            cells.extend(Cell(template, case, case.request(source, summary["bos_token"], summary["eos_token"],
                                                           template_id=summary["id"])) for case in cases)
        from conformance.render.store import ResultStore

        # The service judges; tokens and attribution need local goldens, so they do not run.
        check = CheckRun(cells, judge=ServiceJudge(client), store=ResultStore(), tokens=False)
        [results] = check.check_all([args.runner], get_runner)
    except ServiceError as exc:
        raise UserError(str(exc)) from None
    for result in results.results:
        if not result.status.judged or result.status in ("errored", "timeout"):
            print(f"{result.template_id}/{result.case_id}: {result.status}", file=sys.stderr)
        elif not result.passed:
            where = f" at byte {result.divergence.offset}" if result.divergence else ""
            print(f"{result.template_id}/{result.case_id}: {result.status}{where}")
    fig = results.figure()
    print(f"{describe_figure(fig)}  " + "  ".join(f"{k}={v}" for k, v in sorted(results.counts().items()) if v))
    return EXIT_OK if fig["passed"] == fig["judged"] else EXIT_FAIL


def cmd_export(args) -> int:
    from conformance.corpus.cases import load_cases, select_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.service.export import export_vectors

    templates = load_corpus().select(args.template)
    cases = select_cases(load_cases(), args.case)
    if not templates or not cases:
        raise UserError("the selection is empty (no template or no case matches)")
    header = export_vectors(Path(args.out), templates, cases, progress=progress_printer("export"),
                            bindings=args.bindings)
    print(f"{args.out}: {header['cells']} cells ({header['templates']} templates x {header['cases']} cases)"
          + (f", {len(header['missing_goldens'])} without golden left out" if header["missing_goldens"] else ""))
    return EXIT_OK


def cmd_identify(args) -> int:
    from conformance.analysis.identify import (
        describe,
        identify_gguf,
        load_report,
        probe_bos,
        runner_results,
        template_views,
    )
    from conformance.corpus.manifest import load_corpus
    from conformance.analysis.ollama_choice import probe as probe_ollama
    from runners.gguf_header import read_header

    report, note = load_report(Path(args.report) if args.report else None)
    results = runner_results(report)
    views = template_views(report)
    if report is not None and not results:
        note = f"{note}: no per-cell results in it"
    corpus = load_corpus()
    everything, unknown = [], 0
    for path in args.paths:
        findings = identify_gguf(Path(path), corpus, results, views)
        if args.probe:
            for finding, text in zip(findings, read_header(Path(path)).chat_templates().values()):
                finding.tokens["runners"] = probe_bos(finding, text)
                if finding.ollama.get("ollama.route") != "renderer":
                    finding.ollama["probe"] = probe_ollama(text, finding.bos_token, finding.eos_token,
                                                           finding.corpus_id or "<gguf>")
        unknown += sum(1 for f in findings if f.corpus_id is None)
        everything.extend(findings)
        if not args.json:
            print(describe(Path(path), findings, note))
    if args.json:
        json.dump({"report": note, "templates": [f.to_dict() for f in everything]}, sys.stdout,
                  ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the golden-file service (HTTP; OpenAPI at /openapi.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--ready-file", metavar="PATH", help="write the bound port here once listening")
    p.add_argument("--token", metavar="TOKEN", help="require `Authorization: Bearer TOKEN` on /v1/* (default: "
                   "$CHATGOLD_SERVICE_TOKEN; required with a --host beyond loopback)")
    p.add_argument("--rate-limit", type=float, metavar="N", help="requests per second per client address "
                   "(default: 20 beyond loopback, none on loopback)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("remote-check", help="render with a local runner and check every cell through a service")
    p.add_argument("--service", required=True, metavar="URL", help="base URL of a `chatgold serve`")
    p.add_argument("--runner", required=True, help="runner name (see `chatgold engines list`)")
    p.add_argument("--template", action="append", metavar="GLOB", required=True, help="template id glob (repeatable)")
    p.add_argument("--case", action="append", metavar="GLOB", help="case id glob (repeatable; default all)")
    p.set_defaults(func=cmd_remote_check)

    p = sub.add_parser("export", help="write language-neutral test vectors (JSON Lines, docs/vectors.md)",
                       description="Write the goldens as test vectors (docs/vectors.md). The output is deterministic: "
                                   "the same goldens give the same bytes, gzip included.")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="vectors file to write (vectors.jsonl; vectors.jsonl.gz is gzip-compressed)")
    p.add_argument("--bindings", action="store_true",
                   help="give every cell the variables the reference binds for it (runners/protocol/SEMANTICS.md)")
    p.add_argument("--template", action="append", metavar="GLOB", help="template id glob (repeatable)")
    p.add_argument("--case", action="append", metavar="GLOB", help="case id glob (repeatable)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("identify", help="identify the chat templates inside GGUF files (reads headers only)")
    p.add_argument("paths", nargs="+", metavar="MODEL.gguf")
    p.add_argument("--report", metavar="PATH", help="JSON report with runner results (default reports/report.json, as `tox -e conformance` writes it)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--probe", action="store_true",
                   help="ask the real llama-server (with and without --jinja) and transformers whether the BOS "
                        "reaches the model doubled or missing with this file's template, tokens and flags; and "
                        "render every case as Ollama would (the ollama runner) to name its first differing case")
    p.set_defaults(func=cmd_identify)
