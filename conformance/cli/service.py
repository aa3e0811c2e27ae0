"""Subcommands: serve, remote-check, export, identify."""
from __future__ import annotations

import json
import sys
from pathlib import Path

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def cmd_serve(args) -> int:
    from conformance.service.server import serve

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"chatgold: warning: binding {args.host}: the service is reachable beyond this machine",
              file=sys.stderr)
    serve(args.host, args.port, ready_file=args.ready_file)
    return EXIT_OK


LOCAL_STATUSES = ("errored", "timeout", "skipped")  # the runner's own failures: nothing for the goldens to judge


def judge_through_service(client, runner_name: str, rendered: list, attribute: bool = False) -> list:
    """CellResults for (template id, case id, Outcome) triples, in order: rendered and raised outcomes are
    judged by the service (which holds the goldens); errors, timeouts and skips are classified locally."""
    from runners.base import Raised, Rendered

    from conformance.judge.status import result_for

    remote = []
    for template_id, case_id, outcome in rendered:
        if isinstance(outcome, Rendered):
            remote.append({"template": template_id, "case": case_id, "output": outcome.text})
        elif isinstance(outcome, Raised):
            remote.append({"template": template_id, "case": case_id, "raised": outcome.message})
    judged = iter(client.check_batch(remote, attribute=attribute)) if remote else iter(())
    results = []
    for template_id, case_id, outcome in rendered:
        if isinstance(outcome, (Rendered, Raised)):
            results.append(_result_from_service(runner_name, next(judged), outcome))
        else:
            results.append(result_for(runner_name, template_id, case_id, None, outcome))
    return results


def _result_from_service(runner_name: str, judged: dict, outcome):
    """The service's verdict as the CellResult a local check would have produced for the same outcome."""
    from runners.base import Rendered

    from conformance.judge.status import ENGINE_RENDERED, MATCH, CellResult, fingerprint
    from conformance.judge.diff import Divergence

    status = judged["status"]
    message = (judged.get("reference_message") or "") if status == ENGINE_RENDERED else getattr(outcome, "message", "")
    result = CellResult(
        runner=runner_name, template_id=judged["template"], case_id=judged["case"], status=status,
        divergence=Divergence(**judged["divergence"]) if judged.get("divergence") else None, message=message,
        output=outcome.text if isinstance(outcome, Rendered) and status != MATCH else None,
        golden_kind=judged.get("golden_kind"))
    result.extra["fingerprint"] = fingerprint(result)
    if judged.get("attribution"):
        result.extra["attribution"] = {k: v for k, v in judged["attribution"].items() if v is not None}
    return result


def cmd_remote_check(args) -> int:
    """Render locally through a runner; the service holds the goldens and classifies each cell."""
    from runners import get_runner

    from conformance.corpus.cases import case_from_data
    from conformance.service.client import ServiceClient, ServiceError

    client = ServiceClient(args.service)
    try:
        templates = client.templates(args.template)
        cases = [case_from_data(c, f"{args.service} case {c['id']}") for c in client.cases(args.case)]
        if not templates or not cases:
            print("chatgold: error: the selection is empty (no template or no case matches)", file=sys.stderr)
            return EXIT_USAGE
        runner = get_runner(args.runner)
        rendered = []
        try:
            for summary in templates:
                source = client.template(summary["id"])["source"]
                requests_ = [c.request(source, summary["bos_token"], summary["eos_token"], template_id=summary["id"])
                             for c in cases]
                rendered.extend((summary["id"], case.id, outcome)
                                for case, outcome in zip(cases, runner.render_many(requests_)))
            name = runner.name
        finally:
            runner.close()
        results = judge_through_service(client, name, rendered)
    except ServiceError as exc:
        print(f"chatgold: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    counts = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
        if result.status in LOCAL_STATUSES:
            print(f"{result.key}: {result.status}", file=sys.stderr)
        elif not result.passed:
            where = f" at byte {result.divergence.offset}" if result.divergence else ""
            print(f"{result.key}: {result.status}{where}")
    total = len(results)
    passed = sum(1 for r in results if r.passed)
    print(f"{passed}/{total} cells pass  " + "  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return EXIT_OK if passed == total else EXIT_FAIL


def cmd_export(args) -> int:
    from conformance.corpus.cases import load_cases, select_cases
    from conformance.cli import _progress_printer
    from conformance.corpus.manifest import load_corpus
    from conformance.service.export import export_vectors

    templates = load_corpus().select(args.template)
    cases = select_cases(load_cases(), args.case)
    if not templates or not cases:
        print("chatgold: error: the selection is empty (no template or no case matches)", file=sys.stderr)
        return EXIT_USAGE
    header = export_vectors(Path(args.out), templates, cases, progress=_progress_printer("export"))
    print(f"{args.out}: {header['cells']} cells ({header['templates']} templates x {header['cases']} cases)"
          + (f", {len(header['missing_goldens'])} without golden left out" if header["missing_goldens"] else ""))
    return EXIT_OK


def cmd_identify(args) -> int:
    from conformance.corpus.manifest import load_corpus
    from conformance.corpus.identify import describe, identify_gguf, load_report, runner_results

    report, note = load_report(Path(args.report) if args.report else None)
    results = runner_results(report)
    if report is not None and not results:
        note = f"{note}: no per-cell results in it"
    corpus = load_corpus()
    everything, unknown = [], 0
    for path in args.paths:
        findings = identify_gguf(Path(path), corpus, results)
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
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("remote-check", help="render with a local runner and check every cell through a service")
    p.add_argument("--service", required=True, metavar="URL", help="base URL of a `chatgold serve`")
    p.add_argument("--runner", required=True, help="runner name (see `chatgold engines list`)")
    p.add_argument("--template", action="append", metavar="GLOB", required=True, help="template id glob (repeatable)")
    p.add_argument("--case", action="append", metavar="GLOB", help="case id glob (repeatable; default all)")
    p.set_defaults(func=cmd_remote_check)

    p = sub.add_parser("export", help="write language-neutral test vectors (JSON Lines, docs/vectors.md)")
    p.add_argument("--out", required=True, metavar="PATH", help="vectors file to write (e.g. vectors.jsonl)")
    p.add_argument("--template", action="append", metavar="GLOB", help="template id glob (repeatable)")
    p.add_argument("--case", action="append", metavar="GLOB", help="case id glob (repeatable)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("identify", help="identify the chat templates inside GGUF files (reads headers only)")
    p.add_argument("paths", nargs="+", metavar="MODEL.gguf")
    p.add_argument("--report", metavar="PATH", help="JSON report with runner results (default reports/report.json, as `tox -e conformance` writes it)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=cmd_identify)
