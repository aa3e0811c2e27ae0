"""The gate: the reference reproduces every golden, and each engine matches them (or its expectations)."""
from __future__ import annotations

import pytest

from conformance.gate.syrupy_ext import GoldenExtension
from conformance.judge.diff import compare_bytes
from conformance.judge.goldens import cell_paths, golden_bytes, write_golden
from runners import REFERENCE_RUNNER
from runners.base import Errored, Skipped

pytestmark = pytest.mark.chatgold_gate


def _cases(session, chatgold_case):
    return [c for c in session.cases if chatgold_case is None or c.id == chatgold_case]


@pytest.mark.chatgold_renders(REFERENCE_RUNNER)
def test_reference_reproduces_goldens(chatgold_session, chatgold_template, chatgold_case, request):
    """transformers, as pinned, still renders every golden byte for byte (refusals included). The reference's
    outcomes come from the result store when it holds them for the same transformers, jinja2, template and case
    (--chatgold-verify-reference renders them again); the goldens are compared byte for byte either way."""
    outcomes = chatgold_session.outcomes(REFERENCE_RUNNER)
    updating = request.config.option.update_snapshots
    # syrupy writes the goldens on --snapshot-update; a check compares bytes directly (a syrupy assertion per
    # cell cost more than the whole comparison).
    snap = request.getfixturevalue("snapshot").use_extension(GoldenExtension) if updating else None
    goldens = chatgold_session.goldens
    problems = []
    for case in _cases(chatgold_session, chatgold_case):
        outcome = outcomes[(chatgold_template, case.id)]
        if isinstance(outcome, (Errored, Skipped)):
            problems.append(f"{case.id}: the reference could not render this cell: {outcome}")
            continue
        kind, data = golden_bytes(outcome)
        if updating:
            rendered_path, raised_path = cell_paths(chatgold_template, case.id)
            stale = raised_path if kind == "rendered" else rendered_path
            if stale.exists():  # the golden changes kind: in one atomic step (syrupy then finds it current)
                write_golden(chatgold_template, case.id, outcome)
            assert snap(name=case.id if kind == "rendered" else f"{case.id}.raised") == data
            continue
        golden = goldens(chatgold_template, case.id)
        if golden is None:
            problems.append(f"{case.id}: no golden (run `chatgold goldens update`)")
        elif golden.kind != kind:
            problems.append(f"{case.id}: golden is {golden.kind}, the reference now {kind}: {outcome}")
        elif golden.data != data:
            problems.append(f"{case.id}: the reference no longer reproduces the golden {'refusal' if kind == 'raised' else 'text'}\n"
                            + compare_bytes(golden.data, data).describe())
    if problems:
        pytest.fail(f"{chatgold_template}: {len(problems)} cell(s) differ from the goldens:\n\n" + "\n\n".join(problems),
                    pytrace=False)


def test_goldens_have_no_orphans(chatgold_session):
    """Every golden file belongs to a (template, case) pair of the corpus and the cases."""
    from conformance.judge.goldens import find_orphans

    if not chatgold_session.full:
        pytest.skip("orphan check needs the whole matrix (a selection or shard is active)")
    orphans = find_orphans([t.id for t in chatgold_session.corpus.entries], [c.id for c in chatgold_session.all_cases])
    assert not orphans, "golden files no (template, case) pair produces:\n" + "\n".join(map(str, orphans[:50]))


def test_goldens_record_the_installed_reference():
    """goldens/_meta.json names the transformers/jinja2 versions installed now."""
    from conformance.judge.goldens import read_meta, reference_versions

    meta = read_meta()
    current = reference_versions()
    for package in ("transformers", "jinja2", "tokenizers"):
        assert meta.get(package) == current[package], (
            f"goldens were made with {package} {meta.get(package)}, installed is {current[package]}")
