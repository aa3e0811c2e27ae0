"""Gate: the reference still derives each template's stored capabilities (goldens/<id>/capabilities.json)."""
from __future__ import annotations

import json

import pytest

from conformance.capabilities import capabilities_path, compute_capabilities, encode_capabilities, load_capabilities
from runners import REFERENCE_RUNNER

pytestmark = pytest.mark.chatgold_gate


@pytest.fixture(scope="session")
def derived_capabilities(chatgold_session):
    """Capabilities of the session's selected templates, derived once through the reference runner."""
    results, failures = compute_capabilities(chatgold_session.templates, chatgold_session.runner(REFERENCE_RUNNER))
    return results, dict(failures)


def test_reference_reproduces_capabilities(derived_capabilities, chatgold_template):
    """The differential analysis over the pinned reference gives exactly the stored capability golden."""
    results, failures = derived_capabilities
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
