"""Audit the stored causes of the baselines (conformance/expectations/*.json), from outside.

    python scripts/audit_causes.py --sample 40 --seed 3          # a seeded random sample over every baseline
    python scripts/audit_causes.py --cells-only                    # only the cells-show-the-mechanism count

For each sampled cause:
  - differs: its reproducer rendered again on both sides still differs in the stored way;
  - minimal: no single reduction step of the reducer's own (conformance/explain/minimal.py) keeps that
    difference (1-minimal);
  - cells: every cell filed under it is in a template that uses what the cause is keyed by (its culprit
    constructs, or for a cause with none, the names in the data paths its reproducer reads: `bos_token`,
    `thinking`); an engine that ignores the template is keyed by none.
A table, one row a cause, then the totals. Engines that are not built here are reported as such, never passed.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.explain import cluster  # noqa: E402
from conformance.explain.causes import stored_keyed_names, template_names  # noqa: E402
from conformance.explain.driver import render_pairs  # noqa: E402
from conformance.explain.minimal import is_one_minimal  # noqa: E402
from conformance.explain.signature import compare  # noqa: E402
from conformance.explain.template import lines_of  # noqa: E402
from runners.base import Conversation, RenderRequest, outcome_from_dict  # noqa: E402

EXPECTATIONS = ROOT / "conformance" / "expectations"
# Engines that pick what they print by the template's text (a built-in format by substrings, a record by hash);
# Ollama does for the templates it gives a Go template of its own (text_keyed).
TEXT_KEYED = {"llamacpp-builtin", "paperkiln"}
TEMPLATES = ROOT / "templates"


def load(name: str) -> dict:
    return json.loads((EXPECTATIONS / f"{name}.json").read_text())


def cells_by_cause(baseline: dict) -> dict:
    out = defaultdict(list)
    for template, cases in baseline["cells"].items():
        for case, entry in cases.items():
            cause = entry.partition("@")[2]
            if cause:
                out[cause].append((template, case))
    return out


def ignores_template(cause: dict) -> bool:
    return cause["title"].startswith("the engine ignores the template")


def keyed_names(cause: dict) -> set:
    """What the stored cause is keyed by, recomputed from its reproducer (causes.stored_keyed_names)."""
    if ignores_template(cause):
        return set()
    return stored_keyed_names(cause["repro"], culprits=cause.get("constructs"))


_SOURCES: dict = {}


def _names_of_template(template_id: str) -> set:
    if template_id not in _SOURCES:
        path = TEMPLATES / f"{template_id}.jinja"
        _SOURCES[template_id] = template_names(path.read_text()) if path.exists() else None
    return _SOURCES[template_id]


def text_keyed(runner_name: str, cause: dict) -> bool:
    """Whether the engine picks what it prints for this reproducer by the template's text: a built-in format or
    a record by hash, or Ollama's own Go template chosen by the text's distance to its index."""
    if runner_name in TEXT_KEYED:
        return True
    if runner_name == "ollama":
        from runners.ollama import selection

        return selection.choose(cause["repro"]["template"]).route == selection.ROUTE_GO
    return False


def cells_without_mechanism(cause: dict, cells: list, runner_name: str = "") -> list:
    """The cells under a cause whose template lacks what the cause is keyed by (none for an engine keyed by the
    template's text: its causes are keyed by the format or record the text picks, not by constructs)."""
    keyed = set() if text_keyed(runner_name, cause) else keyed_names(cause)
    if not keyed:
        return []
    out = []
    for template, case in cells:
        names = _names_of_template(template)
        if names is not None and not keyed <= names:
            out.append((template, case))
    return out


def request_of(repro: dict) -> RenderRequest:
    return RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), repro.get("bos_token"),
                         repro.get("eos_token"), "audit", "audit")


def audit(sample: list, reference) -> list:
    from runners import get_runner

    rows = []
    by_runner = defaultdict(list)
    for runner_name, cause in sample:
        by_runner[runner_name].append(cause)
    for runner_name, causes in by_runner.items():
        cells = cells_by_cause(load(runner_name))
        try:
            engine = get_runner(runner_name, workers=1, timeout=60)
        except Exception as exc:  # an engine not built here is said so, never passed
            engine, why = None, f"{type(exc).__name__}: {exc}"
        try:
            for cause in causes:
                row = {"runner": runner_name, "id": cause["id"], "title": cause["title"],
                       "lines": lines_of(cause["repro"]["template"]), "cells": len(cells[cause["id"]]),
                       "reason": bool(cause.get("reason"))}
                off = cells_without_mechanism(cause, cells[cause["id"]], runner_name)
                row["off"] = len(off)
                if engine is None:
                    row.update(differs=None, minimal=None, why=why)
                else:
                    repro = cause["repro"]
                    stored = compare(outcome_from_dict(repro["reference"]), outcome_from_dict(repro["engine"]))
                    [(ref, eng)] = render_pairs(reference, engine, [request_of(repro)])
                    fresh = compare(ref, eng)
                    row["differs"] = bool(fresh is not None and stored is not None and fresh.keeps(stored))
                    if not row["differs"]:
                        row.update(minimal=None, why=f"now {eng.kind} against {ref.kind}: {fresh}")
                    else:
                        # an engine that picks its output by the template's text gets data steps only (as
                        # tests/test_one_minimal.py holds it): any smaller template is another input to it
                        verdict = is_one_minimal(repro, engine, reference,
                                                 template=False if text_keyed(runner_name, cause) else None)
                        row["minimal"] = bool(verdict)
                        row["why"] = "" if verdict else (
                            f"{verdict.kept[0][0]} keeps it: {verdict.kept[0][1][:90]!r}" if verdict.kept
                            else verdict.reason)
                rows.append(row)
                print(_line(row), flush=True)
        finally:
            if engine is not None:
                engine.close()
    return rows


def _line(row: dict) -> str:
    mark = {True: "yes", False: "NO", None: "n/a"}
    return (f"{row['runner']:<17} {row['id']}  differs {mark[row['differs']]:<3} minimal {mark[row['minimal']]:<3} "
            f"cells {row['cells'] - row['off']}/{row['cells']:<6} lines {row['lines']:<3} "
            f"reason {'yes' if row['reason'] else 'NO '}  {row['title'][:70]}"
            + (f"\n{'':19}-> {row['why'][:160]}" if row.get("why") else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--runner", action="append", default=[], help="baselines to draw from (default: all)")
    parser.add_argument("--cells-only", action="store_true")
    parser.add_argument("--expectations", type=Path, default=None, help="folder of baselines (default: the suite's)")
    args = parser.parse_args()
    global EXPECTATIONS
    EXPECTATIONS = args.expectations or EXPECTATIONS
    names = args.runner or sorted(p.stem for p in EXPECTATIONS.glob("*.json"))
    everything = []
    for name in names:
        baseline = load(name)
        cells = cells_by_cause(baseline)
        off = {c["id"]: cells_without_mechanism(c, cells[c["id"]], name) for c in baseline["causes"]}
        n_off = sum(len(v) for v in off.values())
        print(f"{name:<17} causes {len(baseline['causes']):>4}  cells under a cause {sum(map(len, cells.values())):>7}"
              f"  without the cause's mechanism {n_off:>6} (in {sum(1 for v in off.values() if v)} causes)")
        everything += [(name, cause) for cause in baseline["causes"]]
    if args.cells_only:
        return
    sample = random.Random(args.seed).sample(everything, min(args.sample, len(everything)))
    print(f"\n{len(sample)} causes drawn with seed {args.seed} from {len(everything)}\n")
    from runners import get_runner

    reference = get_runner("hf", workers=1)
    try:
        rows = audit(sample, reference)
    finally:
        reference.close()
    right = [r for r in rows if r["differs"] and r["minimal"] and r["off"] == 0 and r["reason"]]
    print(f"\nfully right (differs, 1-minimal, every cell shows it, has a reason): {len(right)} of {len(rows)}")
    for label, test in (("no longer differs", lambda r: r["differs"] is False),
                        ("not 1-minimal", lambda r: r["differs"] and r["minimal"] is False),
                        ("cells without the mechanism", lambda r: r["off"] > 0),
                        ("no reason", lambda r: not r["reason"]),
                        ("engine not available", lambda r: r["differs"] is None)):
        print(f"  {label}: {sum(1 for r in rows if test(r))}")


if __name__ == "__main__":
    main()
