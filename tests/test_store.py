"""The result store (conformance/render/store.py): an outcome is reused only under the same runner identity,
template and case; a corrupt pack is detected and its cells rendered again, never trusted; concurrent writers
lose nothing; the store stays within its bound; the gate with a warm store gives the same verdicts as cold.

The runner is a real harness process (tests/harnesses/counted.py) that logs every render it does, so each test
sees exactly which cells were rendered and which came from the store."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from conformance.render.store import (
    MAGIC,
    CachedRunner,
    ResultStore,
    cached_render_many,
    decode_pack,
    encode_pack,
    request_key,
)
from runners.base import Errored, Raised, RefusalKind, Rendered, RenderRequest, Skipped
from runners.command import CommandRunner

REPO = Path(__file__).resolve().parent.parent
COUNTED = REPO / "tests" / "harnesses" / "counted.py"


def counted(log: Path, build=None, error_on=None) -> CommandRunner:
    argv = [sys.executable, str(COUNTED), str(log)]
    if build is not None:
        argv += ["--build", build]
    if error_on is not None:
        argv += ["--error-on", error_on]
    return CommandRunner(argv, workers=2)


def renders(log: Path) -> int:
    return len(log.read_text(encoding="utf-8", errors="surrogatepass").splitlines()) if log.exists() else 0


def requests(templates=("T1 {{ x }}", "T2 {{ y }}"), contents=("hello", "world"), bos="<s>") -> list:
    return [RenderRequest.make(template, [{"role": "user", "content": content}], bos_token=bos)
            for template in templates for content in contents]


def run(runner, store, reqs, refresh=False) -> list:
    return list(cached_render_many(runner, reqs, store, refresh))


def expected(build, reqs) -> list:
    return [Rendered(f"{build}|{r.template}|{r.messages[0]['content']}|{r.bos_token}") for r in reqs]


@pytest.fixture()
def store(tmp_path):
    return ResultStore(tmp_path / "store", verbose=False)


def test_outcomes_are_reused_only_under_the_same_identity_template_and_case(store, tmp_path):
    log = tmp_path / "log"
    cells = requests()
    with counted(log, build="b1") as runner:
        assert run(runner, store, cells) == expected("b1", cells)
    assert renders(log) == 4 and store.counters.written == 4

    # Same identity, template and case, in a new runner (a new process): nothing is rendered.
    with counted(log, build="b1") as runner:
        assert run(runner, store, cells) == expected("b1", cells)
    assert renders(log) == 4

    # Another build: a different identity, every cell rendered again, no outcome of b1 comes back.
    with counted(log, build="b2") as runner:
        assert run(runner, store, cells) == expected("b2", cells)
    assert renders(log) == 8

    with counted(log, build="b1") as runner:
        # One template changed: only its two cells are rendered.
        changed_template = requests(templates=("T1 {{ x }}", "T2 changed"))
        assert run(runner, store, changed_template) == expected("b1", changed_template)
        assert renders(log) == 10
        # One case changed: only the cells of that conversation.
        changed_case = requests(contents=("hello", "world, again"))
        assert run(runner, store, changed_case) == expected("b1", changed_case)
        assert renders(log) == 12
        # The special tokens are part of the case.
        other_bos = requests(bos="<bos>")
        assert run(runner, store, other_bos) == expected("b1", other_bos)
        assert renders(log) == 16
        # Every field of the conversation is: the same messages with add_generation_prompt set are another case.
        with_prompt = [RenderRequest.make("T1 {{ x }}", [{"role": "user", "content": "hello"}], bos_token="<s>",
                                          add_generation_prompt=True)]
        assert run(runner, store, with_prompt) == expected("b1", with_prompt)
        assert renders(log) == 17
        # refresh (--no-cache) renders everything again and stores it.
        assert run(runner, store, cells, refresh=True) == expected("b1", cells)
        assert renders(log) == 21


def test_a_case_key_is_the_digest_of_the_canonical_conversation_and_tokens():
    """The composed key is the documented one (sha256 of the canonical JSON of conversation and tokens), for
    every case, token pairs with quotes, non-ASCII and nulls: a store written before keeps its keys."""
    from conformance.corpus.cases import load_cases
    from conformance.render.store import case_key
    from runners.base import canonical_json

    for case in load_cases():
        conversation = case.request("t", None, None, "t").conversation
        for bos, eos in (("<s>", "</s>"), (None, None), ('\u00e9"\\', "<|end|>\n"), ("", None)):
            documented = canonical_json({"conversation": conversation.to_dict(), "bos_token": bos,
                                         "eos_token": eos})
            assert case_key(conversation, bos, eos) == hashlib.sha256(documented.encode("utf-8")).hexdigest()
            request = case.request("t", bos, eos, "t")
            assert request_key(request)[1] == case_key(conversation, bos, eos)


def test_a_harness_without_a_build_is_never_cached(store, tmp_path):
    log = tmp_path / "log"
    cells = requests()
    for round_ in (1, 2):
        with counted(log) as runner:
            assert runner.identity() is None
            assert run(runner, store, cells) == expected(None, cells)
        assert renders(log) == 4 * round_
    assert store.packs() == [] and store.counters.written == 0


def test_failures_are_never_stored(store, tmp_path):
    log = tmp_path / "log"
    cells = requests()
    for round_ in (1, 2):
        with counted(log, build="b1", error_on="world") as runner:
            outcomes = run(runner, store, cells)
        assert [type(o) for o in outcomes] == [Rendered, Errored, Rendered, Errored]
        # Round 1 renders all four; round 2 only the two that failed.
        assert renders(log) == (4 if round_ == 1 else 6)


def _corruptions(data: bytes, identity: str, template: str, other_template: str):
    """(what, corrupted bytes) for one valid pack."""
    header_end = data.index(b"\n", len(MAGIC))
    body = data[header_end + 1:]
    header = json.loads(data[len(MAGIC):header_end])

    def with_body(raw: bytes, fix_checksum: bool = True) -> bytes:
        new = zlib.compress(raw)
        meta = dict(header, body=dict(header["body"], bytes=len(new),
                                      sha256=hashlib.sha256(new).hexdigest() if fix_checksum else
                                      header["body"]["sha256"]))
        return MAGIC + json.dumps(meta).encode() + b"\n" + new

    flipped = bytearray(data)
    flipped[header_end + 1 + len(body) // 2] ^= 0x01
    yield "a bit flipped in the body", bytes(flipped)
    yield "truncated", data[:-7]
    yield "empty", b""
    yield "not a pack", b"{}\n"
    yield "header digits changed", data.replace(header["body"]["sha256"].encode(), b"0" * 64, 1)
    raw = zlib.decompress(body)
    index_end = raw.index(b"\n")
    index = json.loads(raw[:index_end])
    key = next(iter(index["entries"]))
    # A pack whose checksum is right but whose content is not what a pack holds (written by something else).
    yield "checksum right, body not JSON", with_body(b"not json\n")
    bad = dict(index, entries=dict(index["entries"], **{key: ["rendered", 0, 10 ** 9]}))
    yield "checksum right, text offsets out of range", with_body(json.dumps(bad).encode() + raw[index_end:])
    bad = dict(index, entries=dict(index["entries"], **{key: ["exploded", 0, 1]}))
    yield "checksum right, unknown record", with_body(json.dumps(bad).encode() + raw[index_end:])
    bad = dict(index, entries=dict(index["entries"], **{key: ["raised", 0, 1, "mystery"]}))
    yield "checksum right, unknown refusal kind", with_body(json.dumps(bad).encode() + raw[index_end:])
    bad = dict(index, entries=dict(index["entries"], **{key: ["capabilities", {}]}))
    yield "checksum right, a side record under a case key", with_body(json.dumps(bad).encode() + raw[index_end:])
    bad = dict(index, entries={**index["entries"], "extra": ["rendered", 0, 0]})
    yield "checksum right, entry count wrong", with_body(json.dumps(bad).encode() + raw[index_end:], True)
    yield "filed under another template", encode_pack(identity, other_template, {})


def test_a_corrupt_pack_is_detected_and_its_cells_rendered_again(store, tmp_path):
    log = tmp_path / "log"
    cells = requests(templates=("T1 {{ x }}",))
    with counted(log, build="b1") as runner:
        assert run(runner, store, cells) == expected("b1", cells)
        digest = store.identity_of(runner)[0]
        template = request_key(cells[0])[0]
        path = store.pack_path(digest, template)
        good = path.read_bytes()
        count = renders(log)
        for what, data in _corruptions(good, digest, template, "f" * 64):
            fresh = ResultStore(store.root, verbose=False)
            path.write_bytes(data)
            assert run(runner, fresh, cells) == expected("b1", cells), what
            assert renders(log) == count + len(cells), f"{what}: the cells were not rendered again"
            count = renders(log)
            assert fresh.counters.corrupt == [str(path)] or not data, what
            # The pack was rewritten from the fresh renders and is valid again.
            assert decode_pack(path.read_bytes(), digest, template), what
            again = ResultStore(store.root, verbose=False)
            assert run(runner, again, cells) == expected("b1", cells)
            assert renders(log) == count and again.counters.hits == len(cells), what


def test_outcomes_round_trip_exactly(store, tmp_path):
    """Lone surrogates, NUL, U+2028, astral characters, every refusal kind and skips come back as stored."""
    texts = ["plain", "lone \ud800 high and \udfff low", "nul \x00 and \u2028 \u2029 \U0001F600", "", "\r\n\t"]
    outcomes = [Rendered(t) for t in texts] + [Raised(f"m{i} \udc80", kind) for i, kind in enumerate(RefusalKind)]
    outcomes.append(Skipped("no documents \ud83d"))
    cells = [RenderRequest.make("T", [{"role": "user", "content": str(i)}]) for i in range(len(outcomes))]
    identity = ("0" * 64, {"name": "test"})
    store.record(identity, cells, outcomes)
    assert store.lookup(identity[0], cells) == outcomes
    assert ResultStore(store.root).lookup(identity[0], cells) == outcomes


def test_the_pack_index_follows_its_schema(store, tmp_path):
    from conformance import schema_validator

    identity = ("0" * 64, {"name": "test"})
    cells = requests()
    store.record(identity, cells, [Rendered("a"), Raised("b", RefusalKind.RAISE), Skipped("c"), Rendered("d \ud800")])
    runner = CachedRunner(counted(tmp_path / "log", build="b1"), store)
    try:
        assert runner.template_capabilities("T", None, None) is None  # the harness has no view: nothing stored
    finally:
        runner.close()
    validator = schema_validator("result-pack.schema.json")
    for path, _, _ in store.packs():
        data = path.read_bytes()
        raw = zlib.decompress(data[data.index(b"\n", len(MAGIC)) + 1:])
        validator.validate(json.loads(raw[:raw.index(b"\n")]))


WRITER = """
import sys
from conformance.render.store import ResultStore
from runners.base import Rendered, RenderRequest
store = ResultStore(sys.argv[1], verbose=False)
identity = ("1" * 64, {"name": "writer"})
me = sys.argv[2]
for i in range(int(sys.argv[3])):
    request = RenderRequest.make("shared template", [{"role": "user", "content": f"{me}-{i}"}])
    store.record(identity, [request], [Rendered(f"{me}-{i}")])
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    """Four processes add outcomes to the same pack at once: every one of them is there afterwards."""
    root = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), f"w{n}", "25"], env=env)
               for n in range(4)]
    assert [w.wait(timeout=300) for w in writers] == [0, 0, 0, 0]
    store = ResultStore(root, verbose=False)
    cells = [RenderRequest.make("shared template", [{"role": "user", "content": f"w{n}-{i}"}])
             for n in range(4) for i in range(25)]
    assert store.lookup("1" * 64, cells) == [Rendered(r.messages[0]["content"]) for r in cells]
    assert not store.counters.corrupt
    assert not [p for p in (root / ("1" * 64)).iterdir() if p.name.endswith(".tmp")]


def test_the_store_stays_within_its_bound(tmp_path):
    store = ResultStore(tmp_path / "store", verbose=False)
    identity = ("2" * 64, {"name": "filler"})
    now = time.time()
    for n in range(10):
        request = RenderRequest.make(f"template {n}", [{"role": "user", "content": "x"}])
        store.record(identity, [request], [Rendered(os.urandom(3000).hex())])
        path = store.pack_path(identity[0], request_key(request)[0])
        os.utime(path, (now - 1000 + n, now - 1000 + n))  # template 0 least recently used
    sizes = {p.name: size for p, size, _ in store.packs()}
    bound = sum(sizes.values()) // 2
    done = store.prune(bound)
    left = store.packs()
    assert done["bytes"] <= bound and sum(size for _, size, _ in left) <= bound
    survivors = {request_key(RenderRequest.make(f"template {n}", []))[0] + ".pack" for n in range(10)
                 if request_key(RenderRequest.make(f"template {n}", []))[0] + ".pack" in {p.name for p, _, _ in left}}
    # The most recently used ones are kept: template 9 survives, template 0 does not.
    assert request_key(RenderRequest.make("template 9", []))[0] + ".pack" in survivors
    assert request_key(RenderRequest.make("template 0", []))[0] + ".pack" not in survivors
    # A store over its bound prunes itself after writing.
    small = ResultStore(tmp_path / "store", max_bytes=1, verbose=False)
    small.record(identity, [RenderRequest.make("new", [])], [Rendered("y")])
    assert small.prune_if_needed() is not None
    assert small.packs() == []


def _cli(*argv, env):
    return subprocess.run([sys.executable, "-m", "conformance.cli", *argv], capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=str(REPO)), cwd=REPO, timeout=600)


def test_cache_commands(tmp_path):
    env = dict(os.environ, CHATGOLD_RESULTS_DIR=str(tmp_path / "store"))
    store = ResultStore(tmp_path / "store", verbose=False)
    store.record(("3" * 64, {"name": "someengine", "version": "9"}), requests(), [Rendered("x")] * 4)
    done = _cli("cache", "stats", "--json", env=env)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["entries"] == 4 and stats["identities"]["3" * 64]["identity"]["name"] == "someengine"
    assert "someengine 9" in _cli("cache", "stats", env=env).stdout
    build = [f"command:{sys.executable} {COUNTED} {tmp_path / 'log'} --build"]
    keys = [_cli("cache", "key", "--runner", f"{build[0]} {b}", env=env).stdout.strip() for b in ("b1", "b1", "b2")]
    assert keys[0] == keys[1] != keys[2] and len(keys[0]) == 16
    assert _cli("cache", "prune", "--max-mb", "0", env=env).returncode == 0
    assert ResultStore(tmp_path / "store").packs() == []
    store.record(("3" * 64, {"name": "someengine"}), requests(), [Rendered("x")] * 4)
    assert "removed 2 packs" in _cli("cache", "clear", env=env).stdout


def test_builtin_runners_give_their_identity():
    from runners import get_runner

    runner = get_runner("minijinja")
    identity = runner.identity()
    assert identity["name"] == "minijinja" and identity["packages"]["minijinja"] != "missing"
    assert len(identity["code"]) == 64
    from runners.hf import HFRunner

    reference = HFRunner().identity()
    assert set(reference["packages"]) >= {"transformers", "tokenizers", "jinja2"}


TEMPLATE = "ai21labs-ai21-jamba-reasoning-3b"
CASES = ["tools-no-parameters", "chat-single-user", "continue-final-message", "system-only"]


def _gate(tmp_path, report: str, *extra):
    from importlib.metadata import entry_points

    plugin = [] if any(e.name == "chatgold" for e in entry_points(group="pytest11")) else ["-p", "conformance.gate.plugin"]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-q", "--pyargs", "conformance.gate",
            "--chatgold-runner", "minijinja", "--chatgold-runner", "evaluator", "--chatgold-workers", "1",
            "--chatgold-template", TEMPLATE, *[x for c in CASES for x in ("--chatgold-case", c)],
            f"--chatgold-report={tmp_path / report}", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), CHATGOLD_RESULTS_DIR=str(tmp_path / "store"))
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def _verdicts(tmp_path, report: str) -> tuple:
    from conformance.report import load_report

    data = load_report(tmp_path / report / "report.json")
    # explain_stats is the root-cause analysis's own telemetry (seconds), not a verdict.
    sections = {name: {k: v for k, v in s.items() if k not in ("runner", "explain_stats")}
                for name, s in data["runners"].items()}
    return sections, sorted(json.dumps(c, sort_keys=True) for c in data.cells)


def test_the_gate_with_a_warm_store_gives_the_same_verdicts_as_cold(tmp_path):
    cold = _gate(tmp_path, "cold")
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert re.search(r": 0 cells reused, [1-9][0-9]* rendered", cold.stdout), cold.stdout
    warm = _gate(tmp_path, "warm")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert re.search(r": [1-9][0-9]* cells reused, 0 rendered", warm.stdout), warm.stdout
    assert _verdicts(tmp_path, "cold") == _verdicts(tmp_path, "warm")
    forced = _gate(tmp_path, "forced", "--chatgold-no-cache")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert re.search(r": 0 cells reused, [1-9][0-9]* rendered", forced.stdout), forced.stdout
    assert _verdicts(tmp_path, "forced") == _verdicts(tmp_path, "cold")


# -- the store deletes only what it wrote (issue 32) -------------------------------------------------------------

def _project(root: Path) -> dict:
    """A folder that is somebody's project: a .git and a source tree; path -> bytes of every file."""
    files = {".git/HEAD": b"ref: refs/heads/main\n", ".git/objects/ab/cdef": b"\x00blob",
             "src/app.py": b"print('mine')\n", "src/empty_dir/.keep": b"", "notes.txt": b"keep me\n"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "src" / "no_pack_here").mkdir()
    return files


def _survives(root: Path, files: dict) -> None:
    for name, data in files.items():
        assert (root / name).read_bytes() == data, name
    assert (root / "src" / "no_pack_here").is_dir()


def test_a_project_folder_as_the_results_dir_survives_prune_clear_and_an_over_bound_check(tmp_path):
    project = tmp_path / "project"
    files = _project(project)
    env = dict(os.environ, CHATGOLD_RESULTS_DIR=str(project), CHATGOLD_RESULTS_MAX_MB="0")
    for argv in (("cache", "prune"), ("cache", "prune", "--max-mb", "0"), ("cache", "clear")):
        done = _cli(*argv, env=env)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "not a result store" in done.stderr and str(project) in done.stderr
        _survives(project, files)
    done = _cli("check", "--runner", "evaluator", "--template", TEMPLATE, "--case", "chat-single-user",
                "--no-explain", "--no-attribution", env=env)
    assert done.returncode in (0, 1), done.stderr
    assert "continuing without it" in done.stderr and "not a result store" in done.stderr
    _survives(project, files)
    assert not (project / "CHATGOLD-RESULT-STORE").exists()


def test_prune_and_clear_touch_only_packs_and_the_stores_own_files(tmp_path):
    root = tmp_path / "store"
    store = ResultStore(root, verbose=False)
    identity = ("4" * 64, {"name": "someengine"})
    store.record(identity, requests(), [Rendered("x")] * 4)
    assert (root / "CHATGOLD-RESULT-STORE").is_file()
    # Things the store did not write, inside it and inside an identity folder.
    (root / "mine").mkdir()
    (root / "mine" / "data.txt").write_text("mine")
    (root / "README").write_text("mine")
    (root / identity[0] / "notes.txt").write_text("mine")
    (root / identity[0] / "x.pack").write_text("not a digest name: not a pack")
    other = root / ("5" * 64)
    other.mkdir()
    (other / "precious.txt").write_text("mine")
    stale = root / identity[0] / f".{'6' * 64}.pack.abc123.tmp"
    stale.write_bytes(b"half a pack")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    env = dict(os.environ, CHATGOLD_RESULTS_DIR=str(root))
    done = _cli("cache", "prune", "--max-mb", "0", env=env)
    assert done.returncode == 0 and "removed 2 packs" in done.stdout, done.stdout + done.stderr
    assert not stale.exists() and store.packs() == []
    store.record(identity, requests(), [Rendered("x")] * 4)
    done = _cli("cache", "clear", env=env)
    assert done.returncode == 0 and "removed 2 packs" in done.stdout, done.stdout + done.stderr
    assert "removed 0 packs" in _cli("cache", "clear", env=env).stdout
    for path in (root / "mine" / "data.txt", root / "README", root / identity[0] / "notes.txt",
                 root / identity[0] / "x.pack", other / "precious.txt"):
        assert path.read_text() in ("mine", "not a digest name: not a pack"), path
    assert (root / "CHATGOLD-RESULT-STORE").is_file()


def test_an_older_store_without_the_marker_is_adopted(tmp_path):
    root = tmp_path / "store"
    store = ResultStore(root, verbose=False)
    identity = ("7" * 64, {"name": "someengine"})
    store.record(identity, requests(), [Rendered("x")] * 4)
    (root / "CHATGOLD-RESULT-STORE").unlink()
    again = ResultStore(root, verbose=False)
    assert again.lookup(identity[0], requests()) == [Rendered("x")] * 4
    assert (root / "CHATGOLD-RESULT-STORE").is_file()
    assert again.clear() == 2 and not (root / identity[0]).exists()


def test_max_mb_must_be_a_finite_number(tmp_path):
    env = dict(os.environ, CHATGOLD_RESULTS_DIR=str(tmp_path / "store"))
    for value in ("inf", "nan", "-1", "lots"):
        done = _cli("check", "--runner", "evaluator", "--template", TEMPLATE, "--case", "chat-single-user",
                    "--no-explain", env=dict(env, CHATGOLD_RESULTS_MAX_MB=value))
        assert done.returncode == 2 and "CHATGOLD_RESULTS_MAX_MB" in done.stderr, (value, done.stderr)
        done = _cli("cache", "prune", "--max-mb", value, env=env)
        assert done.returncode == 2 and "--max-mb" in done.stderr, (value, done.stderr)


@pytest.mark.parametrize("state", ["read-only", "a file", "foreign folder"])
def test_an_unusable_store_is_left_with_a_warning_not_an_aborted_check(tmp_path, state):
    root = tmp_path / "store"
    immutable = False
    if state == "a file":
        root.write_text("I am a file")
    elif state == "foreign folder":
        root.mkdir()
        (root / "thesis.tex").write_text("mine")
    else:
        root.mkdir()
        root.chmod(0o555)
        if os.access(root, os.W_OK):
            # root ignores permissions: the immutable attribute makes the folder read-only for root too
            subprocess.run(["chattr", "+i", str(root)], check=True, capture_output=True)
            immutable = True
    try:
        store = ResultStore(root)
        log = tmp_path / "log"
        with counted(log, build="b1") as runner:
            assert run(runner, store, requests()) == expected("b1", requests())
            assert run(runner, store, requests()) == expected("b1", requests())
        assert renders(log) == 8 and store.unusable and store.counters.written == 0
        assert store.prune_if_needed() is None
        env = dict(os.environ, CHATGOLD_RESULTS_DIR=str(root))
        done = _cli("check", "--runner", "evaluator", "--template", TEMPLATE, "--case", "chat-single-user",
                    "--no-explain", env=env)
        assert done.returncode in (0, 1) and "continuing without it" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(root)], check=True, capture_output=True)
        if root.is_dir():
            root.chmod(0o755)
    if state == "a file":
        assert root.read_text() == "I am a file"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_pack_that_is_not_a_regular_file_of_bounded_size_is_corrupt_not_read(store, tmp_path, kind):
    import conformance.render.store as module

    identity = ("8" * 64, {"name": "someengine"})
    cells = requests(templates=("T1 {{ x }}",))
    store.record(identity, cells, [Rendered("x")] * 2)
    path = store.pack_path(identity[0], request_key(cells[0])[0])
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        with open(path, "wb") as handle:
            handle.truncate(module.MAX_PACK_BYTES + 1)  # sparse: no disk used
    started = time.monotonic()
    assert store.lookup(identity[0], cells) == [None, None]
    assert time.monotonic() - started < 5
    assert store.counters.corrupt == [str(path)]
    store.record(identity, cells, [Rendered("y")] * 2)  # the next write replaces it with a pack
    assert ResultStore(store.root, verbose=False).lookup(identity[0], cells) == [Rendered("y")] * 2
    assert store.stats()["packs"] == 1


def test_a_store_that_fails_to_write_is_left_for_the_run(tmp_path, capsys):
    """The write path a read-only disk takes (an OSError from the store's own write), shown without root
    permissions: the identity's folder is a file, so every write fails. The run goes on, renders every cell,
    says so once, and leaves the file alone."""
    root = tmp_path / "store"
    store = ResultStore(root)
    log = tmp_path / "log"
    with counted(log, build="b1") as runner:
        digest = store.identity_of(runner)[0]
        root.mkdir()
        (root / "CHATGOLD-RESULT-STORE").write_text("marker")
        (root / digest).write_text("not a folder")
        assert run(runner, store, requests()) == expected("b1", requests())
        assert run(runner, store, requests()) == expected("b1", requests())
    assert renders(log) == 8 and store.counters.written == 0 and "cannot write" in store.unusable
    assert capsys.readouterr().err.count("continuing without it") == 1
    assert (root / digest).read_text() == "not a folder"
