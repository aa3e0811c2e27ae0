"""Gate: the suite's own sensitivity. Every broken -> fixed revision pair the corpus holds is told apart by a
golden or a property, unless no case could reveal it (conformance/analysis/audit.py UNREVEALABLE, with why)."""
from __future__ import annotations

import pytest

from conformance.analysis.audit import UNREVEALABLE, run_audit

pytestmark = pytest.mark.chatgold_gate


@pytest.fixture(scope="module")
def audit(chatgold_session):
    return run_audit(chatgold_session.corpus.entries, [c.id for c in chatgold_session.all_cases],
                     goldens=chatgold_session.goldens)


def test_every_revealable_pair_is_told_apart(audit):
    missed = [r for r in audit["rows"] if not r["told_apart"] and not r.get("unrevealable")]
    assert not missed, (f"the suite tells {audit['told_apart']} of {audit['pairs']} revision pairs apart; missed, and "
                        "not known to be unrevealable (add a case that reveals them):\n"
                        + "\n".join(f"  {r['a']} / {r['b']} ({r['how']}: {r['found']})" for r in missed))


def test_unrevealable_pairs_are_current(audit):
    """Each pair recorded as unrevealable is still a pair, and still missed: else the record is stale."""
    rows = {tuple(sorted((r["a"], r["b"]))): r for r in audit["rows"]}
    stale = [f"{a} / {b}: {'no longer a pair' if (a, b) not in rows else 'now told apart'}"
             for a, b in UNREVEALABLE if (a, b) not in rows or rows[(a, b)]["told_apart"]]
    assert not stale, "UNREVEALABLE entries to remove:\n" + "\n".join(stale)
