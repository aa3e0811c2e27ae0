"""What the gate's analysis-golden tests share: a stored record against the one derived this session."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Optional

import pytest

from conformance.files import ENCODING_ERRORS


def check_derived(template_id: str, derived: dict, failures: dict, stored: Optional[dict], path: Path,
                  encode: Callable[[dict], bytes], update: str) -> None:
    """Fail unless the reference derived this template's record again, exactly as stored."""
    assert template_id not in failures, f"{template_id}: the reference failed: {failures[template_id]}"
    assert stored is not None, f"{path}: missing (run `{update}` or `chatgold goldens update`)"
    record = derived[template_id]
    if stored != record:
        pytest.fail(f"{path} no longer matches the reference:\n"
                    f"--- stored\n{encode(stored).decode('utf-8', ENCODING_ERRORS)}"
                    f"--- derived now\n{encode(record).decode('utf-8', ENCODING_ERRORS)}", pytrace=False)


def check_present(template_ids: Iterable[str], path_of: Callable[[str], Path], encode: Callable[[dict], bytes],
                  name: str) -> None:
    """Every template has the record, valid JSON in canonical form."""
    template_ids = list(template_ids)
    missing = [t for t in template_ids if not path_of(t).exists()]
    assert not missing, f"{len(missing)} template(s) without {name}: {', '.join(missing[:20])}"
    for template_id in template_ids:
        raw = path_of(template_id).read_bytes()
        assert raw == encode(json.loads(raw)), f"{path_of(template_id)}: not in canonical form"
