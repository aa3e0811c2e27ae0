"""Run chatgold test vectors through plain jinja2: a consumer written from docs/vectors.md and SEMANTICS.md alone.

    python vectors_jinja2.py vectors.jsonl[.gz] [--statuses OUT.jsonl] [--show N]

Reads the vectors (`chatgold export`), renders every cell with plain_jinja2.py (the rules of SEMANTICS.md on
jinja2), judges each outcome as docs/vectors.md says and prints the counts. Exit 0 when every cell passes
(match or both-raised), 1 otherwise. `--statuses` writes one {"template", "case", "status"} line per cell.
Standard library and jinja2 only; copy it next to plain_jinja2.py and run it anywhere.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys

from plain_jinja2 import render

PASSING = ("match", "both-raised")


def read_vectors(path: str):
    """(header, iterator of cells); a .gz file is decompressed."""
    handle = gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")
    header = json.loads(handle.readline())
    if header.get("record") != "header" or header.get("format") != 2:
        raise SystemExit(f"{path}: not a chatgold vectors file of format 2 (first line: {str(header)[:200]})")

    def cells():
        with handle:
            for line in handle:
                yield json.loads(line)
    return header, cells()


def utf8(text: str) -> bytes:
    # A golden may hold a lone surrogate: compared as its 3-byte encoding (docs/vectors.md).
    return text.encode("utf-8", "surrogatepass")


def judge(expected: dict, outcome: tuple) -> str:
    """The status of one cell (docs/vectors.md, "Judging a cell")."""
    if expected["kind"] == "rendered":
        if outcome[0] == "raised":
            return "engine-raised"
        return "match" if utf8(outcome[1]) == utf8(expected["text"]) else "diverged"
    if outcome[0] == "rendered":
        return "engine-rendered"
    kind, message = outcome[1], outcome[2]
    refusal = expected["refusal"]
    if kind != refusal["kind"] or (kind == "raise" and refusal["message"] not in message):
        return "raised-differently"
    return "both-raised"


def first_difference(a: str, b: str) -> int:
    a, b = utf8(a), utf8(b)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vectors")
    parser.add_argument("--statuses", metavar="OUT.jsonl", help="write every cell's status here")
    parser.add_argument("--show", type=int, default=10, metavar="N", help="print the first N failures (default 10)")
    args = parser.parse_args(argv)
    header, cells = read_vectors(args.vectors)
    counts = collections.Counter()
    shown = 0
    out = open(args.statuses, "w", encoding="utf-8") if args.statuses else None
    try:
        for cell in cells:
            template, case, expected = cell["template"], cell["case"], cell["expected"]
            outcome = render(template["source"], template["bos_token"], template["eos_token"], case)
            status = judge(expected, outcome)
            counts[status] += 1
            if out:
                out.write(json.dumps({"template": template["id"], "case": case["id"], "status": status}) + "\n")
            if status not in PASSING and shown < args.show:
                shown += 1
                got = outcome[1] if outcome[0] == "rendered" else f"raised {outcome[1]}: {outcome[2]}"
                where = (f" at byte {first_difference(outcome[1], expected['text'])}"
                         if status == "diverged" else "")
                print(f"{template['id']} x {case['id']}: {status}{where}\n  expected: {expected['text'][:300]!r}"
                      f"\n  got:      {got[:300]!r}")
    finally:
        if out:
            out.close()
    total = sum(counts.values())
    passed = sum(counts[s] for s in PASSING)
    print(f"{passed}/{total} cells pass ({100.0 * passed / total if total else 100.0:.2f}%) against "
          f"{', '.join(f'{k} {v}' for k, v in sorted(header['reference'].items()))}: "
          + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0 if passed == total and total == header["cells"] else 1


if __name__ == "__main__":
    sys.exit(main())
