"""Hardening of what chatgold writes and reads (issue #21 items 5-7): a golden that changes kind does so in one
step whatever instant its writer is killed at, a killed corpus import leaves nothing behind, and every CLI path
turns bad input (a directory, a missing file, deep nesting, an oversized template) into one line and exit 2."""
from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hardening_support import measured
from test_identify import write_gguf

from conformance import repo_root
from conformance.judge.goldens import find_orphans, read_golden, write_golden
from runners.base import MAX_TEMPLATE_BYTES, Raised, Rendered

KILLS = 25


def _python(code: str, *args: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=repo_root(),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# A writer flipping one cell between its two kinds as fast as it can, among other cells of the template.
FLIPPER = """
    import sys
    from pathlib import Path
    from conformance.judge.goldens import write_golden
    from runners.base import Raised, Rendered
    root = Path(sys.argv[1])
    n = 0
    while True:
        n += 1
        write_golden("t", "cell", Raised(f"refused {n}") if n % 2 else Rendered(f"rendered {n}"), root)
"""


def test_a_golden_changes_kind_in_one_step_whatever_instant_the_writer_dies(tmp_path):
    root = tmp_path / "goldens"
    for index in range(20):
        write_golden("t", f"other{index}", Rendered(f"other {index}"), root)
    write_golden("t", "cell", Rendered("rendered 0"), root)
    others = {f"other{i}": read_golden("t", f"other{i}", root) for i in range(20)}
    seen: list = []
    stop = threading.Event()

    def reader():  # readers never see the cell missing, nor both kinds at once
        while not stop.is_set():
            golden = read_golden("t", "cell", root)
            seen.append(golden is not None)

    watcher = threading.Thread(target=reader, daemon=True)
    watcher.start()
    rng = random.Random(21)
    try:
        for _ in range(KILLS):
            writer = _python(FLIPPER, str(root))
            time.sleep(rng.uniform(0.4, 1.2))  # interpreter start-up, then some hundred kind changes
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            names = sorted(p.name for p in (root / "t").iterdir() if p.name.startswith("cell"))
            assert len(names) == 1, f"after a kill the cell has {names}"
            golden = read_golden("t", "cell", root)
            assert golden.kind == ("raised" if names[0].endswith(".raised.txt") else "rendered")
            assert golden.text.split()[0] == ("refused" if golden.kind == "raised" else "rendered")
            assert {f"other{i}": read_golden("t", f"other{i}", root) for i in range(20)} == others
    finally:
        stop.set()
        watcher.join()
    assert seen and all(seen), f"a reader found no golden {seen.count(False)} times"
    # What a kill leaves is hidden from readers and reported (then removed) by the orphan check.
    leftovers = [p for p in find_orphans(["t"], ["cell"] + [f"other{i}" for i in range(20)], root)]
    assert all(p.name.startswith(".t.swap-") for p in leftovers), leftovers
    write_golden("t", "cell", Raised("final"), root)
    write_golden("t", "cell", Rendered("final"), root)
    assert not find_orphans(["t"], ["cell"] + [f"other{i}" for i in range(20)], root)


IMPORTER = """
    import sys
    from pathlib import Path
    from conformance.corpus.manifest import import_files
    import_files([Path(sys.argv[2])], Path(sys.argv[1]))
"""


def test_a_killed_import_leaves_nothing_behind(tmp_path):
    from conformance.corpus.manifest import IMPORT_JOURNAL, load_corpus, templates_dir

    root = tmp_path / "templates"
    shutil.copytree(templates_dir(), root)
    known = len(load_corpus(root).entries)
    rng = random.Random(5)
    for attempt in range(6):
        template = tmp_path / f"fresh-{attempt}.jinja"
        template.write_text(f"{{{{ messages[0].content }}}} attempt {attempt}")
        importer = _python(IMPORTER, str(root), str(template))
        time.sleep(rng.uniform(0.5, 4.0))
        importer.send_signal(signal.SIGKILL)
        importer.wait()
        corpus = load_corpus(root)  # the next command that reads the corpus undoes a killed import
        files = {p.name for p in root.glob("*.jinja")}
        assert files == {e.file for e in corpus.entries}, files ^ {e.file for e in corpus.entries}
        assert not (root / IMPORT_JOURNAL).exists() and not list(root.glob(".*.tmp"))
        for entry in corpus.entries:
            assert entry.path().exists()
        # Whole or nothing: the killed import added its one template with its text, or added nothing.
        assert len(corpus.entries) - known in (0, 1), (known, len(corpus.entries))
        assert all(entry.source_bytes() for entry in corpus.entries)
        sources = {entry.source() for entry in corpus.entries}
        assert (template.read_text() in sources) == (len(corpus.entries) == known + 1)
        known = len(corpus.entries)
    constructs = json.loads((root / "constructs.json").read_text())
    assert set(constructs) == {e.sha256 for e in load_corpus(root).entries}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=repo_root(), capture_output=True,
                          text=True, timeout=timeout)


def test_bad_input_on_every_cli_path_is_one_line_and_exit_2(tmp_path):
    deep_case = tmp_path / "deep.json"
    deep_case.write_text('{"id": "deep", "description": "d", "features": ["chat"], "messages": [{"role": "user", '
                         '"content": ' + "[" * 100000 + "]" * 100000 + "}]}")
    nested_case = tmp_path / "nested.json"
    nested_case.write_text('{"id": "nested", "description": "d", "features": ["chat"], "messages": [{"role": '
                           '"user", "content": ' + "[" * 5000 + "]" * 5000 + "}]}")
    deep_gguf = write_gguf(tmp_path / "deep.gguf", "{% if x %}" * 5000 + "{% endif %}" * 5000)
    big = tmp_path / "big.jinja"
    big.write_text("{{ 'x' }}\n" * (MAX_TEMPLATE_BYTES // 10 + 1))
    runs = {
        "identify a directory": ["identify", str(tmp_path)],
        "identify a missing file": ["identify", str(tmp_path / "missing.gguf")],
        "import a deep template": ["corpus", "import", str(deep_gguf)],
        "import a directory": ["corpus", "import", str(tmp_path)],
        "import an oversized template": ["corpus", "import", str(big)],
        "render an oversized template": ["render", "--runner", "evaluator", "--template-file", str(big), "--case",
                                         "chat-single-user"],
        "render a case nested past the parser": ["render", "--runner", "evaluator", "--template",
                                                 "qwen-qwen2.5-7b-instruct", "--case-file", str(deep_case)],
        "render a case nested 5000 deep": ["render", "--runner", "evaluator", "--template",
                                           "qwen-qwen2.5-7b-instruct", "--case-file", str(nested_case)],
        "render a case that is a directory": ["render", "--template", "qwen-qwen2.5-7b-instruct", "--case-file",
                                              str(tmp_path)],
    }
    for label, args in runs.items():
        done = _cli(*args)
        assert done.returncode == 2, (label, done.returncode, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chatgold: error: "), (label, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, label
    assert not list(Path(repo_root(), "templates").glob(".*.tmp"))


def test_a_50_mb_template_in_a_valid_gguf_is_refused_quickly_and_leaves_nothing(tmp_path):
    """The issue's reproduction: one `{% if %}{{ }}{% endif %}` line repeated to 50 MB inside a valid GGUF. Before,
    `corpus import` ran past 300 s at 2.1 GB; now import and render refuse it at once, bounded in memory, and the
    corpus is untouched."""
    line = "{% if x %}{{ y }}{% endif %}\n"
    gguf_path = write_gguf(tmp_path / "big.gguf", line * (50 * 1024 * 1024 // len(line)))
    root = tmp_path / "templates"
    shutil.copytree(Path(repo_root(), "templates"), root)
    before = sorted(p.name for p in root.iterdir())
    found = measured(f"""
        import subprocess, sys, time
        runs = {{}}
        for args in (["corpus", "import", {str(gguf_path)!r}],
                     ["render", "--runner", "evaluator", "--template-file", {str(gguf_path)!r}, "--case",
                      "chat-single-user"]):
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "conformance.cli", *args], capture_output=True, text=True,
                                  env=dict(__import__("os").environ, CHATGOLD_ROOT={str(tmp_path)!r}))
            runs[args[0]] = [done.returncode, done.stderr, time.monotonic() - started]
        result["runs"] = runs
    """)
    for command, (code, stderr, seconds) in found["runs"].items():
        assert code == 2 and "over the limit of" in stderr and "Traceback" not in stderr, (command, stderr)
        assert seconds < 60, (command, seconds)
    assert found["children_peak_mb"] < 600, found  # the file's 50 MB string, read once
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_deep_gguf_header_is_refused_with_an_offset(tmp_path):
    """Arrays nested in arrays (what a GGUF would need to nest) are refused where they start, at any depth."""
    import struct

    from runners.gguf_header import GGUFHeaderError, read_header

    key = b"deep.key"
    nested = b"".join(struct.pack("<IQ", 9, 1) for _ in range(100000))  # ARRAY of 1 ARRAY of 1 ...
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + nested
    path = tmp_path / "nested.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFHeaderError, match="byte offset"):
        read_header(path)
    done = _cli("identify", str(path))
    assert done.returncode == 2 and "malformed GGUF at byte offset" in done.stderr and "Traceback" not in done.stderr
