"""Gate: the reference still derives each template's stored property record (goldens/<id>/properties.json)."""
from __future__ import annotations

import json

import pytest

from conformance.analysis.properties import encode_properties, load_properties, properties_path
from conformance.gate.plugin import PROPERTIES_JOB

pytestmark = pytest.mark.chatgold_gate


@pytest.mark.chatgold_renders(PROPERTIES_JOB)
def test_reference_reproduces_properties(chatgold_session, chatgold_template):
    """Prefix stability, generation prompt, marker balance, repr leaks, time invariance, determinism and
    faithfulness, checked again through the pinned reference, give exactly the stored record."""
    results, failures = chatgold_session.properties()
    assert chatgold_template not in failures, f"{chatgold_template}: the reference failed: {failures[chatgold_template]}"
    stored = load_properties(chatgold_template)
    assert stored is not None, (f"{properties_path(chatgold_template)}: missing "
                                "(run `chatgold properties update` or `chatgold goldens update`)")
    derived = results[chatgold_template]
    if stored != derived:
        pytest.fail(f"{properties_path(chatgold_template)} no longer matches the reference:\n"
                    f"--- stored\n{encode_properties(stored).decode('utf-8', 'surrogatepass')}"
                    f"--- derived now\n{encode_properties(derived).decode('utf-8', 'surrogatepass')}", pytrace=False)


def test_every_template_has_properties(chatgold_session):
    """Every selected template carries a property record that is valid JSON in canonical form."""
    missing = [t.id for t in chatgold_session.templates if not properties_path(t.id).exists()]
    assert not missing, f"{len(missing)} template(s) without properties.json: {', '.join(missing[:20])}"
    for entry in chatgold_session.templates:
        raw = properties_path(entry.id).read_bytes()
        assert raw == encode_properties(json.loads(raw)), f"{properties_path(entry.id)}: not in canonical form"
