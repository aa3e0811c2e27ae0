"""`chatgold render --cause c-... --runner R`: replay a baseline cause's minimal reproducer through a runner.

The reproducer (template, conversation, special tokens) comes from the runner's baseline, found as `check`
finds it (conformance/judge/expectations.baseline_directory). The engine's bytes go to stdout, as `render`
writes them; stderr says what the baseline recorded on both sides and whether the engine still differs from
the recorded reference outcome.
"""
from __future__ import annotations

import json
import sys

from conformance.cli.common import UserError


def _shown(outcome: dict) -> str:
    if outcome.get("kind") == "rendered":
        return "rendered " + json.dumps(outcome.get("text", ""), ensure_ascii=False)[:300]
    return f"{outcome.get('kind')} " + json.dumps(outcome.get("message", ""), ensure_ascii=False)[:300]


def replay_cause(args):
    """(the runner's outcome, exit code helper data): renders the cause's reproducer and reports on stderr."""
    from conformance.judge.expectations import baseline_directory, load_expectations
    from runners import get_runner
    from runners.base import Conversation, RenderRequest

    spec = args.runner
    runner = get_runner(spec)
    try:
        name = str(runner.start().get("name", spec)) if spec.startswith("command:") else spec.partition("@")[0]
        directory = baseline_directory(getattr(runner, "suite_baseline", True), args.expectations)
        baseline = load_expectations(name, directory)
        cause = baseline.causes.get(args.cause)
        if cause is None:
            known = ", ".join(list(baseline.causes)[:5])
            raise UserError(f"{baseline.path}: no cause {args.cause}" + (f" (it has {len(baseline.causes)}: {known}"
                                                                          f"{', ...' if len(baseline.causes) > 5 else ''})"
                                                                          if baseline.causes else " (it has none)"))
        repro = cause.repro or {}
        try:
            request = RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), repro.get("bos_token"),
                                    repro.get("eos_token"))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{baseline.path}: cause {args.cause} records no usable reproducer ({exc})") from None
        outcome = runner.render(request)
    finally:
        runner.close()
    print(f"cause {cause.id}: {cause.title}", file=sys.stderr)
    print(f"  from {baseline.path}; template {json.dumps(repro['template'], ensure_ascii=False)[:300]}", file=sys.stderr)
    print(f"  case {json.dumps(repro['case'], ensure_ascii=False)[:300]}", file=sys.stderr)
    reference, recorded = repro.get("reference") or {}, repro.get("engine") or {}
    if reference:
        print(f"  reference (recorded): {_shown(reference)}", file=sys.stderr)
    if recorded:
        print(f"  engine (recorded):    {_shown(recorded)}", file=sys.stderr)
    now = {"kind": outcome.kind, "text": getattr(outcome, "text", None), "message": getattr(outcome, "message", "")}
    print(f"  engine (now):         {_shown(now)}", file=sys.stderr)
    if reference:
        from conformance.explain.signature import compare
        from runners.base import outcome_from_dict

        from conformance.judge.status import PASSING

        symptom = compare(outcome_from_dict(reference), outcome)  # judged as check judges a cell
        print("  " + ("the engine now gives the reference's outcome: the cause no longer reproduces"
                      if symptom is None or symptom.status in PASSING else f"still differs from the reference ({symptom.status})"), file=sys.stderr)
    return outcome
