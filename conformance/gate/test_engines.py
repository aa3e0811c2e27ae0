"""The gate for engines: every cell is a match, or the known divergence its runner's expectations record
(conformance/expectations/<runner>.json; hf and the evaluator have none and must match everything)."""
from __future__ import annotations

import warnings

import pytest

from conformance.judge.expectations import describe_cell
from conformance.judge.status import Verdict

pytestmark = pytest.mark.chatgold_gate


def test_engine_matches_expectations(chatgold_session, chatgold_runner, chatgold_template, chatgold_case):
    run = chatgold_session.results(chatgold_runner)
    unexpected, news = [], []
    for case in chatgold_session.cases:
        if chatgold_case is not None and case.id != chatgold_case:
            continue
        result = run.by_cell[(chatgold_template, case.id)]
        if result.verdict.failing:
            unexpected.append(result)
        elif result.verdict == Verdict.UNEXPECTED_PASS:
            news.append(describe_cell(result))
    chatgold_session.attribute(unexpected)  # where it diverged, for the message
    if news:
        # Good news is not a failure, but the baseline is stale: say so where pytest shows warnings.
        warnings.warn(f"{chatgold_runner} {chatgold_template}: {len(news)} known divergence(s) now pass "
                      f"(`chatgold expectations update --runner {chatgold_runner} --template {chatgold_template} "
                      f"--expectations {_folder(run)}`):\n"
                      + "\n".join(news), UserWarning, stacklevel=1)
    if unexpected:
        pytest.fail(f"{chatgold_runner} on {chatgold_template}: {len(unexpected)} unexpected outcome(s)\n\n"
                    + "\n\n".join(describe_cell(r) for r in unexpected), pytrace=False)


def test_known_causes_still_reproduce(chatgold_session, chatgold_runner):
    """A known root cause whose reproducer no longer differs is news, not a failure: the baseline is stale."""
    run = chatgold_session.results(chatgold_runner)
    stale = run.explanation.stale if run.explanation is not None else []
    if stale:
        warnings.warn(f"{chatgold_runner}: {len(stale)} known root cause(s) no longer reproduce "
                      f"(`chatgold expectations update --runner {chatgold_runner} --expectations {_folder(run)}`):\n"
                      + "\n".join(f"  {c['id']} {c.get('title', '')}: {c['reason']}" for c in stale),
                      UserWarning, stacklevel=1)


def _folder(run) -> str:
    """The folder the runner's baseline was read from (`expectations update` writes only where it is told)."""
    path = run.expectations.path
    return str(path.parent) if path is not None else "DIR"
