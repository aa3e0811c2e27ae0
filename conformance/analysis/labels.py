"""Lint's precision and recall on hand-labelled templates (conformance/analysis/lint-labels.json).

A finding lint counts as a violation (class `violation`, analysis/findings.py) is a true positive when the
label says the template really has that defect, a false positive when it does not; a labelled defect lint
shows only as a capability or design finding is a false negative. Recall is over the defects the raw
properties report: a defect no property sees is outside what the labels can measure.

    python -m conformance.analysis.labels     renders the labelled templates through the reference and prints
                                              the figures (docs/properties.md quotes them)
"""
from __future__ import annotations

import json
from pathlib import Path

LABELS = Path(__file__).with_name("lint-labels.json")
# training: the rules were developed on these; held_out: labelled blind, then used to revise the rules;
# held_out_2: labelled blind, then used to revise the rules again; held_out_3: labelled blind after that, never
# used to change a rule; held_out_4 and held_out_5: the same, later (their two misses on a role's name between
# two header markers then made the compound-header rule general: they no longer count as blind); held_out_6:
# labelled blind after that change, whose three misses (and two of held_out_4's) then made five rules general;
# held_out_7: labelled blind after those (the held-out figures)
PARTS = ("training", "held_out", "held_out_2", "held_out_3", "held_out_4", "held_out_5", "held_out_6", "held_out_7")


def load_labels(path: Path = LABELS) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def score(findings: dict, labels: dict) -> dict:
    """Per part and over both: tp, fp, fn, tn, precision, recall, plus the findings without a label and the
    labels without a finding (both must be empty for the figures to mean anything)."""
    out: dict = {}
    unlabelled, unseen, disagree = [], [], []
    total = {"tp": 0, "fp": 0, "fn": 0, "tn": 0}
    for part in (p for p in PARTS if p in labels):
        counts = {"tp": 0, "fp": 0, "fn": 0, "tn": 0}
        for template, marks in labels[part].items():
            got = {(f["property"], f["kind"]): f["class"] for f in findings.get(template, [])}
            wanted = {(m["property"], m["kind"]): m["defect"] for m in marks}
            unlabelled += [f"{template}: {p}/{k}" for p, k in sorted(set(got) - set(wanted))]
            unseen += [f"{template}: {p}/{k}" for p, k in sorted(set(wanted) - set(got))]
            for key in set(got) & set(wanted):
                flagged, defect = got[key] == "violation", wanted[key]
                counts["tp" if flagged and defect else "fp" if flagged else "fn" if defect else "tn"] += 1
                if flagged != defect:
                    disagree.append(f"{part}: {template}: {key[0]}/{key[1]}")
        out[part] = _figures(counts, len(labels[part]))
        for key in total:
            total[key] += counts[key]
    out["all"] = _figures(total, sum(len(labels[p]) for p in PARTS if p in labels))
    out["unlabelled"], out["unseen"], out["disagree"] = unlabelled, unseen, sorted(disagree)
    return out


def _figures(counts: dict, templates: int) -> dict:
    flagged, defects = counts["tp"] + counts["fp"], counts["tp"] + counts["fn"]
    return {**counts, "templates": templates, "findings": sum(counts.values()),
            "precision": round(counts["tp"] / flagged, 4) if flagged else None,
            "recall": round(counts["tp"] / defects, 4) if defects else None,
            "raw_precision": round(defects / sum(counts.values()), 4) if sum(counts.values()) else None}


def measure(workers: int = 2) -> dict:
    """Lint every labelled template (corpus bytes and special tokens) and score it against the labels."""
    from conformance.analysis.findings import lint_templates
    from conformance.corpus.manifest import load_corpus

    labels = load_labels()
    corpus = load_corpus()
    entries = [corpus.get(t) for part in PARTS for t in labels.get(part, {})]
    _, findings = lint_templates(entries, workers)
    return score(findings, labels)


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
