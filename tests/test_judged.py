"""Judged results kept in the result store (conformance/judge/judged.py): a warm check takes a template's judged
cells as they were only while the runner, the template, every request and every golden are unchanged, and gives
exactly the results judging again would; a changed golden, a damaged file or a failure is judged (or asked) again.

The runner is a real harness process (tests/harnesses/counted.py) that logs every render; goldens are real files
in a temporary folder, of every kind a judge meets (a match, a divergence, a reference refusal, none)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.checkrun import CheckRun
from conformance.judge.goldens import GoldenStore
from conformance.judge.pipeline import Cell
from conformance.judge.status import Status
from conformance.render.store import JUDGED_SUFFIX, ResultStore
from runners.base import Conversation, Raised, RefusalKind, Rendered, RenderRequest
from runners.command import CommandRunner

REPO = Path(__file__).resolve().parent.parent
COUNTED = REPO / "tests" / "harnesses" / "counted.py"
BUILD = "b1"
TEMPLATES = ("A {{ x }}", "B {{ y }}", "C {{ z }}")
CONTENTS = ("match", "differs", "refused", "missing", "empty")


def _cells() -> list:
    conversations = {c: Conversation(messages=[{"role": "user", "content": c}]) for c in CONTENTS}
    return [Cell(SimpleNamespace(id=f"t{t}", family=None), SimpleNamespace(id=content),
                 RenderRequest(source, conversations[content], "<s>", None, f"t{t}", content))
            for t, source in enumerate(TEMPLATES) for content in CONTENTS]


def _goldens(root: Path) -> None:
    """A match, a divergence, a refusal the engine does not give, no golden, and an empty golden per template."""
    for t, source in enumerate(TEMPLATES):
        folder = root / f"t{t}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "match.txt").write_bytes(f"{BUILD}|{source}|match|<s>".encode())
        (folder / "differs.txt").write_bytes(f"{BUILD}|{source}|differs|</s>".encode())
        (folder / "refused.raised.txt").write_bytes(b"TemplateError: no")
        (folder / "empty.txt").write_bytes(b"")


def _renders(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _check(tmp_path, store, refresh=False, error_on=None):
    argv = [sys.executable, str(COUNTED), str(tmp_path / "renders.log"), "--build", BUILD]
    if error_on:
        argv += ["--error-on", error_on]
    with CommandRunner(argv, workers=2) as runner:
        run = CheckRun(_cells(), goldens=GoldenStore(tmp_path / "goldens"), store=store, refresh=refresh,
                       tokens=False, expectations_dir=tmp_path / "expectations")
        return run.check(runner)


def _fresh(tmp_path):
    """The same check judged from scratch: no store at all."""
    return _check(tmp_path, None)


def _same(a, b) -> None:
    assert [r.to_dict() for r in a.results] == [r.to_dict() for r in b.results]
    assert [r.outcome for r in a.results] == [r.outcome for r in b.results]
    assert a.results == b.results


@pytest.fixture()
def store(tmp_path):
    _goldens(tmp_path / "goldens")
    (tmp_path / "expectations").mkdir()
    return ResultStore(tmp_path / "store", verbose=False)


def test_a_warm_check_takes_the_judged_cells_and_gives_what_judging_again_gives(tmp_path, store):
    cold = _check(tmp_path, store)
    assert {str(r.status) for r in cold.results} >= {"match", "diverged", "engine-rendered", "no-golden"}
    files = sorted(p.name for p in (tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"))
    assert len(files) == len(TEMPLATES)
    rendered = _renders(tmp_path / "renders.log")
    hits = store.counters.hits
    warm = _check(tmp_path, store)
    assert _renders(tmp_path / "renders.log") == rendered  # nothing rendered
    assert store.counters.hits - hits == len(warm.results)
    _same(warm, cold)
    _same(warm, _fresh(tmp_path))
    # The engine's outcome is kept as it was, whatever its kind.
    by_case = {r.case_id: r for r in warm.results if r.template_id == "t0"}
    assert by_case["match"].outcome == Rendered(f"{BUILD}|A {{{{ x }}}}|match|<s>")
    assert by_case["refused"].status is Status.ENGINE_RENDERED
    assert by_case["differs"].divergence is not None and by_case["differs"].golden_window is not None


def test_a_changed_golden_judges_its_template_again(tmp_path, store):
    _check(tmp_path, store)
    golden = tmp_path / "goldens" / "t1" / "differs.txt"
    golden.write_bytes(f"{BUILD}|{TEMPLATES[1]}|differs|<s>".encode())  # now the engine's output exactly
    warm = _check(tmp_path, store)
    assert next(r for r in warm.results if r.key == ("t1", "differs")).status is Status.MATCH
    assert next(r for r in warm.results if r.key == ("t0", "differs")).status is Status.DIVERGED
    _same(warm, _fresh(tmp_path))
    (tmp_path / "goldens" / "t2" / "refused.raised.txt").write_bytes(b"TemplateError: another message")
    _same(_check(tmp_path, store), _fresh(tmp_path))


def test_a_damaged_judged_file_is_judged_again_never_trusted(tmp_path, store):
    cold = _check(tmp_path, store)
    for path in (tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    _same(_check(tmp_path, store), cold)
    path = next((tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"))
    path.write_bytes(b"not a judged file")
    _same(_check(tmp_path, store), cold)


def test_a_template_with_a_failed_cell_keeps_nothing_and_is_asked_again(tmp_path, store):
    first = _check(tmp_path, store, error_on="missing")
    assert sum(str(r.status) == "errored" for r in first.results) == len(TEMPLATES)
    assert not list((tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"))
    rendered = _renders(tmp_path / "renders.log")
    again = _check(tmp_path, store, error_on="missing")
    assert _renders(tmp_path / "renders.log") == rendered + len(TEMPLATES)  # only the failed cells, asked again
    assert [r.status for r in again.results] == [r.status for r in first.results]


def test_refresh_renders_and_judges_every_cell_again(tmp_path, store):
    cold = _check(tmp_path, store)
    rendered = _renders(tmp_path / "renders.log")
    _same(_check(tmp_path, store, refresh=True), cold)
    assert _renders(tmp_path / "renders.log") == rendered + len(cold.results)


def test_a_refusal_and_an_empty_text_survive_the_round_trip():
    """Every field of a result that is not a plain match is kept exactly: "" stays "", a refusal keeps its kind."""
    from conformance.judge.judged import decode_section, encode_section
    from conformance.judge.status import CellResult

    results = [CellResult("e", "t", "a", Status.ENGINE_RAISED, message="TypeError: x", golden_kind="rendered",
                          refusal="render", outcome=Raised("TypeError: x", RefusalKind.RENDER), fingerprint="f"),
               CellResult("e", "t", "b", Status.DIVERGED, output="", golden_kind="rendered", outcome=Rendered(""),
                          reference_message="", fingerprint="g")]
    data = encode_section("d", results)
    back = decode_section(data, "d", "e", "t", ["a", "b"], [None, None])
    assert [r.to_dict() for r in back] == [r.to_dict() for r in results]
    assert back[1].output == "" and back[1].reference_message == "" and back == results
    assert decode_section(data, "another digest", "e", "t", ["a", "b"], [None, None]) is None


def test_the_store_prunes_and_clears_judged_files_with_its_packs(tmp_path, store):
    _check(tmp_path, store)
    judged = list((tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"))
    assert len(judged) == len(TEMPLATES) and store.stats()["identities"]
    assert sum(row["judged"] for row in store.stats()["identities"].values()) == len(TEMPLATES)
    assert store.clear() > 0
    assert not list((tmp_path / "store").rglob(f"*{JUDGED_SUFFIX}"))
    assert not [p for p in (tmp_path / "store").iterdir() if p.is_dir()]  # identity folders left empty go too
