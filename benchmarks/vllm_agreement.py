"""How often the `vllm` runner's cited reproduction (runners/vllm_runner.py, ReproducedRenderer) gives the outcome
of vLLM 0.33.0's own chat layer (runners/vllm_wheel.py, what the runner renders with), over every corpus template
x case: `python -m benchmarks.vllm_agreement [--template GLOB ...] [--json PATH]`.

Both run in one process of the vllm environment (`python -m runners.vllm_runner --compare`). Texts agree byte
for byte; refusals agree when both refuse, skips when both skip. Prints the counts per case and in total.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections import Counter


def main(argv=None) -> int:
    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus
    from runners.versions import checkout_harness
    from runners.vllm_runner import vllm_python

    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_agreement", description=__doc__)
    parser.add_argument("--template", action="append", help="template ids to include (glob; repeatable)")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args(argv)
    entries = load_corpus().select(args.template)
    cases = load_cases()
    argv_, env = checkout_harness(vllm_python(), "runners.vllm_runner")
    proc = subprocess.Popen([*argv_, "--compare"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            text=True, encoding="utf-8")
    cells = [(entry, case) for entry in entries for case in cases]

    def feed() -> None:
        for entry, case in cells:
            request = case.request(entry.source(), entry.bos_token, entry.eos_token, entry.id)
            proc.stdin.write(json.dumps(request.to_wire(), ensure_ascii=False) + "\n")
        proc.stdin.close()

    threading.Thread(target=feed, daemon=True).start()
    totals: Counter = Counter()
    by_case: dict = {}
    disagreements = []
    for entry, case in cells:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the compare process stopped at {entry.id} x {case.id} ({proc.wait()})")
        answer = json.loads(line)
        key = "agree" if answer["agree"] else "differ"
        totals[key] += 1
        totals[f"wheel {answer['wheel']}"] += 1
        by_case.setdefault(case.id, Counter())[key] += 1
        if not answer["agree"]:
            disagreements.append(f"{entry.id} x {case.id}: wheel {answer['wheel']}, reproduction "
                                 f"{answer['reproduction']}")
    proc.wait()
    for case_id, counts in sorted(by_case.items()):
        if counts["differ"]:
            print(f"{case_id}: {counts['agree']} agree, {counts['differ']} differ")
    total = totals["agree"] + totals["differ"]
    print(f"{totals['agree']} of {total} requests agree ({100 * totals['agree'] / max(total, 1):.2f}%); "
          f"the wheel rendered {totals['wheel rendered']}, raised {totals['wheel raised']}, "
          f"skipped {totals['wheel skipped']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"totals": dict(totals), "by_case": {k: dict(v) for k, v in by_case.items()},
                       "disagreements": disagreements}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
