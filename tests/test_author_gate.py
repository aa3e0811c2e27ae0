"""The engine author's path, tried from outside (issue 31): an honest `harness validate`, baselines that are the
author's own, the gate's change summary by cause, replaying a cause, report sizes and progress in CI logs."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LACKING = ROOT / "tests" / "harnesses" / "lacking.py"
PROTOCOL = ROOT / "runners" / "protocol"


def chatgold(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    environment.pop("CHATGOLD_EXPECTATIONS_DIR", None)
    return subprocess.run([sys.executable, "-m", "conformance.cli", *map(str, args)], cwd=cwd or ROOT,
                          env=environment, capture_output=True, text=True, timeout=timeout)


# -- 1. harness validate: a missing global or an `unsupported` refusal is a DIFF ---------------------------------

def _validate(*flags):
    from runners.protocol.validate import validate_harness

    out = io.StringIO()
    result = validate_harness([sys.executable, str(LACKING), *flags], out=out, timeout=20)
    return result, out.getvalue()


def test_an_engine_without_raise_exception_or_strftime_now_differs_and_conforms():
    result, text = _validate("--no-raise-exception", "--no-strftime-now", "--no-trim-blocks", "--protocol", "1")
    assert result, text
    assert result.protocol == 1
    assert re.search(r"^DIFF refusal-raise: the engine does not bind `raise_exception`", text, re.M), text
    assert re.search(r"^DIFF strftime_now: the engine does not bind `strftime_now`", text, re.M), text
    assert re.search(r"^DIFF trim_blocks: ", text, re.M), text
    assert "FAIL" not in text


def test_a_refusal_of_kind_unsupported_is_accepted_as_a_difference():
    result, text = _validate("--unsupported")
    assert result, text
    assert re.search(r"^DIFF refusal-compile: the engine declines the template as a whole: raised \(unsupported\)",
                     text, re.M), text


def test_raise_exceptions_message_under_the_wrong_kind_still_fails(tmp_path):
    """The leniency is for engines that lack the global, not for harnesses that mislabel a refusal."""
    harness = tmp_path / "mislabel.py"
    harness.write_text(
        "import sys\nsys.path.insert(0, %r)\nimport minimal_harness\nfaithful = minimal_harness.render_with_engine\n"
        "def engine(*a):\n    o = faithful(*a)\n    return ('raised', 'render', o[2]) if o[0] == 'raised' and o[1] == "
        "'raise' else o\nminimal_harness.render_with_engine = engine\nminimal_harness.main()\n"
        % str(ROOT / "runners" / "examples"))
    from runners.protocol.validate import validate_harness

    out = io.StringIO()
    assert not validate_harness([sys.executable, str(harness)], out=out)
    assert "FAIL refusal-raise: expected a refusal of kind raise" in out.getvalue()


def test_validate_first_line_is_what_the_harness_sent():
    _, text = _validate("--name", "Exactly-This", "--build", "b7")
    first = text.splitlines()[0]
    assert first.startswith("ok   start: the harness answered {")
    sent = json.loads(first.split("answered ", 1)[1])
    assert sent == {"name": "Exactly-This", "version": "1", "language": "python",
                    "homepage": "https://jinja.palletsprojects.com/", "build": "b7", "protocol": 2}


def test_protocol_md_introduction_table_and_schema_agree_on_the_refusal_kinds():
    schema = json.loads((PROTOCOL / "render-response.schema.json").read_text())
    kinds = set(schema["$defs"]["message"]["properties"]["kind"]["enum"])
    text = (PROTOCOL / "PROTOCOL.md").read_text()
    intro = re.search(r"every refusal says its \*\*kind\*\*:(.*?);", text, re.S).group(1)
    table = set(re.findall(r"^\| `([a-z]+)` \| .*\| (?:jinja2|any other|nothing)", text, re.M))
    assert set(re.findall(r"`([a-z]+)`", intro)) == kinds
    assert table == kinds
