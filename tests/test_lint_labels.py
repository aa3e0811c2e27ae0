"""Lint's finding classes against the hand labels (conformance/analysis/lint-labels.json): every finding on the
labelled templates is labelled and every label is still found, and precision stays at or above 90% over all of
them (docs/properties.md quotes the figures)."""
from __future__ import annotations

import copy

import pytest

from conformance.analysis.labels import PARTS, load_labels, measure, score


@pytest.fixture(scope="module")
def measured():
    return measure(workers=2)


def test_the_labels_cover_at_least_30_templates():
    labels = load_labels()
    assert sum(len(labels[p]) for p in PARTS) >= 30
    assert len(labels["held_out_2"]) >= 12 and len(labels["held_out_3"]) + len(labels["held_out_4"]) >= 12
    assert len(labels["held_out_5"]) >= 15 and len(labels["held_out_6"]) >= 15 and len(labels["held_out_7"]) >= 15
    named = [t for p in PARTS for t in labels[p]]
    assert len(named) == len(set(named))  # no template in two parts
    assert all(isinstance(m["defect"], bool) and m["why"] for p in PARTS for ms in labels[p].values() for m in ms)


def test_every_finding_is_labelled_and_every_label_is_found(measured):
    assert measured["unlabelled"] == [] and measured["unseen"] == []


# Where lint's class and the hand label still disagree, each with why (none may appear or vanish unseen), both
# from held_out_7, scored after its labels were committed and left as they are (no rule changed after seeing them):
# - Ghost 8B takes tool turns only under roles of its own (`tools`, `execute`, `response`): a standard `tool`
#   message falls through every role branch and prints with no header, so its `<|cos|>` closes nothing. An input
#   it does not take, but no rule knows a role the template has no branch for; the tool-turn design rules (a
#   turn kept open, a turn that goes on after a result) do not fit (a false violation);
# - VAETKI's generation prompt closes an empty reasoning block when tools are given (a branch on `tools`) and
#   opens one otherwise: the format's choice, but the suffix rules know only tool turns, not the tools input
#   (a false violation).
# Right since a rule made general after held_out_6 (each a shape of template behaviour, never a template):
# - a pair of markers is one turn header only where the template's own probes print it so: Phi-3-medium's
#   `<|assistant|>` printed after every user turn, then the next `<|user|>`, is a turn left open (was design);
# - a content part that is the template's own text (a default system prompt put in place of parts) shows no
#   part kept: Rnj-1's system message as parts is an input it does not take (was a violation);
# - a generation prompt that only drops past assistants' reasoning is the format's choice: A.X 4.0 (was a
#   violation);
# - a stray closer that ends the template's own prose spelling its marker pair: A.X 4.0's
#   `<tool_call>{"name": ...}</tool_call>` after Korean prose (was a violation);
# - the template's own instruction moving with the last user message, as a system message may: Jamba
#   Reasoning's thinking instruction (was a violation).
# Right since the compound-header rule takes a role's name between two different markers on one line for one
# header: InternLM's `<|im_start|>system name=<|plugin|>` and Solar Open's `<|begin|>ROLE<|content|>` (both were
# false violations).
KNOWN_MISSES = ["held_out_7: ghost-x-ghost-8b-beta-1608: marker-balance/stray-closer",
                "held_out_7: nc-ai-consortium-vaetki-20b-a2b: generation-prompt/suffix-varies"]


def test_every_label_is_lints_class_but_the_known_misses(measured):
    assert measured["disagree"] == KNOWN_MISSES


def test_held_out_figures(measured):
    # held_out_7 was labelled blind after the last rule change (five rules made general on held_out_4's and
    # held_out_6's misses): its figures are the held-out ones (docs/properties.md): 4 of 6 violations real, 4 of
    # 4 defects found
    assert {k: measured["held_out_7"][k] for k in ("tp", "fp", "fn", "tn")} == {"tp": 4, "fp": 2, "fn": 0, "tn": 10}
    # held_out_6 was the held-out part before that change (9 of 12 violations real when scored, 9 of 9 defects
    # found); its three misses were fixed by general rules
    assert {k: measured["held_out_6"][k] for k in ("tp", "fp", "fn", "tn")} == {"tp": 9, "fp": 0, "fn": 0, "tn": 24}
    # held_out_3..5 were labelled blind before the compound-header change (14 of 17 violations real then): for reference
    held = {k: sum(measured[p][k] for p in ("held_out_3", "held_out_4", "held_out_5")) for k in ("tp", "fp", "fn")}
    assert held == {"tp": 15, "fp": 0, "fn": 0}
    assert {k: measured["held_out_5"][k] for k in ("tp", "fp", "fn", "tn")} == {"tp": 6, "fp": 0, "fn": 0, "tn": 11}


def test_precision_and_recall(measured):
    assert measured["all"]["precision"] >= 0.9
    assert measured["all"]["recall"] >= 0.9
    # the split is what makes lint precise: every raw finding as a violation would be far below
    assert measured["all"]["raw_precision"] < measured["all"]["precision"]


def test_the_score_can_fail():
    labels = load_labels()
    template = "google-gemma-4-31b-it"
    findings = {template: [{"property": m["property"], "kind": m["kind"], "class": "violation"}
                           for m in labels["training"][template]]}
    only = {"training": {template: labels["training"][template]}, "held_out": {}}
    flagged = score(findings, only)
    assert flagged["all"]["fp"] == sum(not m["defect"] for m in labels["training"][template]) > 0
    wrong = copy.deepcopy(only)
    wrong["training"][template].pop()
    assert score(findings, wrong)["unlabelled"]
