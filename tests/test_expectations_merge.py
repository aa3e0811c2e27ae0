"""`chatgold expectations merge`: baselines recorded shard by shard (`expectations update --shard I/N`, one
machine each) merge into the baseline one recording of the whole selection gives."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.judge.pipeline import shard_of

# Templates over all three shards of 3 (asserted), MiniJinja's tojson causes (number and quote escaping) in each.
TEMPLATES = ["allenai-olmo-3.2-tokenizer-think-dev", "allenai-olmo-3-7b-instruct-sft", "allenai-olmo-3-7b-instruct",
             "allenai-olmo-3.1-32b-instruct"]
CASES = ["tools-number-edges", "tools-markup-in-json"]
ROOT = Path(__file__).resolve().parent.parent


def chatgold(*argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CHATGOLD_EXPECTATIONS_DIR", None)
    return subprocess.run([sys.executable, "-m", "conformance.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def record(directory: Path, cwd: Path, *extra) -> None:
    selection = [x for t in TEMPLATES for x in ("--template", t)] + [x for c in CASES for x in ("--case", c)]
    done = chatgold("expectations", "update", "--runner", "minijinja", "--expectations", str(directory),
                    "--workers", "1", *selection, *extra, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    assert sorted({shard_of(t, 3) for t in TEMPLATES}) == [0, 1, 2], "every shard must hold a template"
    root = tmp_path_factory.mktemp("merge")
    record(root / "whole", root)
    for index in (1, 2, 3):
        record(root / f"shard{index}", root, "--shard", f"{index}/3")
    return root


def merge(root: Path, out: Path, parts):
    return chatgold("expectations", "merge", "--runner", "minijinja", "--expectations", str(out),
                    *[x for index, path in parts for x in ("--part", f"{index}/3", str(path))], cwd=root)


def test_merged_shards_are_the_whole_recording(recorded):
    whole = (recorded / "whole" / "minijinja.json").read_text()
    data = json.loads(whole)
    assert data["causes"] and len(data["cells"]) == len(TEMPLATES)
    # each shard's recording holds its own templates only (it started from no baseline)
    for index in (1, 2, 3):
        part = json.loads((recorded / f"shard{index}" / "minijinja.json").read_text())
        assert {shard_of(t, 3) for t in part["cells"]} == {index - 1}
    done = merge(recorded, recorded / "merged", [(3, recorded / "shard3"), (1, recorded / "shard1" / "minijinja.json"),
                                                 (2, recorded / "shard2")])
    assert done.returncode == 0, done.stderr
    assert "found in several shards" in done.stdout and "(0 found in several" not in done.stdout, done.stdout
    assert (recorded / "merged" / "minijinja.json").read_text() == whole


def test_a_reason_one_shard_carries_is_kept_and_a_cause_is_listed_once(recorded, tmp_path):
    parts = []
    for index in (1, 2, 3):
        data = json.loads((recorded / f"shard{index}" / "minijinja.json").read_text())
        if index == 2:
            for cause in data["causes"]:
                cause["reason"] = "written by hand on shard 2"
        path = tmp_path / f"part{index}.json"
        path.write_text(json.dumps(data))
        parts.append((index, path))
    done = merge(tmp_path, tmp_path / "out", parts)
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "out" / "minijinja.json").read_text())
    ids = [c["id"] for c in merged["causes"]]
    assert len(ids) == len(set(ids))
    named = {v.partition("@")[2] for cases in merged["cells"].values() for v in cases.values()} - {""}
    assert named == set(ids)
    shard2 = {v.partition("@")[2] for t, cases in merged["cells"].items() if shard_of(t, 3) == 1
              for v in cases.values()} - {""}
    assert shard2 and all(c["reason"] == "written by hand on shard 2" for c in merged["causes"] if c["id"] in shard2)


def test_a_missing_or_doubled_shard_is_a_clear_error(recorded, tmp_path):
    done = merge(recorded, tmp_path, [(1, recorded / "shard1"), (3, recorded / "shard3")])
    assert done.returncode == 2 and "missing: 2" in done.stderr, done.stderr
    done = merge(recorded, tmp_path, [(1, recorded / "shard1"), (1, recorded / "shard1"), (3, recorded / "shard3")])
    assert done.returncode == 2 and "given twice: 1" in done.stderr, done.stderr
    assert not (tmp_path / "minijinja.json").exists()
