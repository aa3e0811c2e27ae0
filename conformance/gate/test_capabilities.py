"""Gate: the reference still derives each template's stored capabilities (goldens/<id>/capabilities.json)."""
from __future__ import annotations

import json

import pytest

from conformance.analysis.capabilities import (
    capabilities_path,
    encode_capabilities,
    load_capabilities,
)
from conformance.gate.plugin import CAPABILITIES_JOB

pytestmark = pytest.mark.chatgold_gate


@pytest.mark.chatgold_renders(CAPABILITIES_JOB)
def test_reference_reproduces_capabilities(chatgold_session, chatgold_template):
    """The differential analysis over the pinned reference gives exactly the stored capability golden."""
    results, failures = chatgold_session.capabilities()
    assert chatgold_template not in failures, f"{chatgold_template}: the reference failed a probe: {failures[chatgold_template]}"
    stored = load_capabilities(chatgold_template)
    assert stored is not None, (f"{capabilities_path(chatgold_template)}: missing "
                                "(run `chatgold capabilities update` or `chatgold goldens update`)")
    derived = results[chatgold_template]
    if stored != derived:
        stored_text = encode_capabilities(stored).decode("utf-8", "surrogatepass")
        derived_text = encode_capabilities(derived).decode("utf-8", "surrogatepass")
        pytest.fail(f"{capabilities_path(chatgold_template)} no longer matches the reference:\n"
                    f"--- stored\n{stored_text}--- derived now\n{derived_text}", pytrace=False)


def test_every_template_has_capabilities(chatgold_session):
    """Every selected template carries a capability golden that is valid JSON."""
    missing = [t.id for t in chatgold_session.templates if not capabilities_path(t.id).exists()]
    assert not missing, f"{len(missing)} template(s) without capabilities.json: {', '.join(missing[:20])}"
    for entry in chatgold_session.templates:
        raw = capabilities_path(entry.id).read_bytes()
        assert raw == encode_capabilities(json.loads(raw)), f"{capabilities_path(entry.id)}: not in canonical form"
