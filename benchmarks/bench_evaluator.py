"""Per-render time of the evaluator vs the HF reference, both in-process, measured in one run.

    python benchmarks/bench_evaluator.py [--templates N] [--repeat R] [--out results.json]

Each (template, conversation) is rendered once by both engines to warm their compile caches, then timed
R times alternately; the report gives total seconds, per-render means and the evaluator/HF ratio
(< 1 means the evaluator is faster). Traced rendering is timed on the same cells.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from test_evaluator_support import CONVERSATIONS, real_templates  # noqa: E402

from runners.base import RenderRequest  # noqa: E402
from runners.evaluator import ChatTemplate, EvaluatorError  # noqa: E402
from runners.evaluator.runner import EvaluatorRunner  # noqa: E402
from runners.hf import HFRenderer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=40, help="how many corpus templates (spread evenly)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    templates = real_templates()
    if not templates:
        sys.exit("no templates: import the corpus into templates/ first")
    ids = sorted(templates)
    step = max(1, len(ids) // args.templates)
    chosen = ids[::step][:args.templates]
    requests = [RenderRequest.make(templates[t], template_id=t, case_id=c, **conv)
                for t in chosen for c, conv in CONVERSATIONS.items()]

    hf, evaluator = HFRenderer(), EvaluatorRunner()
    for request in requests:  # warm both compile caches
        hf.render(request)
        evaluator.render_in_process(request)
    traceable = [r for r in requests if not r.continue_final_message]

    hf_time = ev_time = trace_time = plain_time = 0.0
    for _ in range(args.repeat):
        for request in requests:
            started = time.perf_counter()
            hf.render(request)
            middle = time.perf_counter()
            evaluator.render_in_process(request)
            ended = time.perf_counter()
            hf_time += middle - started
            ev_time += ended - middle
        for request in traceable:
            template = ChatTemplate(request.template)
            options = dict(tools=request.tools, documents=request.documents,
                           add_generation_prompt=request.add_generation_prompt, bos_token=request.bos_token,
                           eos_token=request.eos_token, kwargs=dict(request.kwargs), now=request.now)
            started = time.perf_counter()
            try:
                template.render(request.messages, **options)
            except EvaluatorError:
                continue
            middle = time.perf_counter()
            template.render_traced(request.messages, **options)
            ended = time.perf_counter()
            plain_time += middle - started
            trace_time += ended - middle

    renders = len(requests) * args.repeat
    result = {
        "templates": len(chosen), "cells": len(requests), "repeat": args.repeat, "renders": renders,
        "hf_seconds": round(hf_time, 4), "evaluator_seconds": round(ev_time, 4),
        "hf_ms_per_render": round(1000 * hf_time / renders, 4),
        "evaluator_ms_per_render": round(1000 * ev_time / renders, 4),
        "evaluator_over_hf": round(ev_time / hf_time, 4) if hf_time else None,
        "traced_over_plain": round(trace_time / plain_time, 4) if plain_time else None,
        "python": platform.python_version(), "machine": platform.machine(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")


if __name__ == "__main__":
    main()
