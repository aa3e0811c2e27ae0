"""The gate for engines: every cell is a match, or the known divergence its runner's expectations record
(conformance/expectations/<runner>.json; hf and the evaluator have none and must match everything)."""
from __future__ import annotations

import warnings

import pytest

from conformance.judge.expectations import FAILING_VERDICTS, UNEXPECTED_PASS, explain
from conformance.report.gate import runner_verdicts

pytestmark = pytest.mark.chatgold_gate


def test_engine_matches_expectations(chatgold_session, chatgold_runner, chatgold_template, chatgold_case):
    verdicts = runner_verdicts(chatgold_session, chatgold_runner)
    unexpected, news = [], []
    for case in chatgold_session.cases:
        if chatgold_case is not None and case.id != chatgold_case:
            continue
        result, verdict_name, expectation = verdicts.cells[(chatgold_template, case.id)]
        if verdict_name in FAILING_VERDICTS:
            unexpected.append((result, expectation, verdict_name))
        elif verdict_name == UNEXPECTED_PASS:
            news.append(explain(result, expectation, verdict_name))
    chatgold_session.attribute([result for result, _, _ in unexpected])  # where it diverged, for the message
    unexpected = [explain(*found) for found in unexpected]
    if news:
        # Good news is not a failure, but the baseline is stale: say so where pytest shows warnings.
        warnings.warn(f"{chatgold_runner} {chatgold_template}: {len(news)} known divergence(s) now pass "
                      f"(`chatgold expectations update --runner {chatgold_runner} --template {chatgold_template}`):\n"
                      + "\n".join(news), UserWarning, stacklevel=1)
    if unexpected:
        pytest.fail(f"{chatgold_runner} on {chatgold_template}: {len(unexpected)} unexpected outcome(s)\n\n"
                    + "\n\n".join(unexpected), pytrace=False)
