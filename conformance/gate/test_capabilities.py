"""Gate: the reference still derives each template's stored capabilities (goldens/<id>/capabilities.json)."""
from __future__ import annotations

import pytest

from conformance.analysis.capabilities import (
    capabilities_path,
    encode_capabilities,
    load_capabilities,
)
from conformance.gate.plugin import CAPABILITIES_JOB
from conformance.gate.records import check_derived, check_present

pytestmark = pytest.mark.chatgold_gate


@pytest.mark.chatgold_renders(CAPABILITIES_JOB)
def test_reference_reproduces_capabilities(chatgold_session, chatgold_template):
    """The differential analysis over the pinned reference gives exactly the stored capability golden."""
    results, failures = chatgold_session.capabilities()
    check_derived(chatgold_template, results, failures, load_capabilities(chatgold_template),
                  capabilities_path(chatgold_template), encode_capabilities, "chatgold capabilities update")


def test_every_template_has_capabilities(chatgold_session):
    """Every selected template carries a capability golden that is valid JSON in canonical form."""
    check_present([t.id for t in chatgold_session.templates], capabilities_path, encode_capabilities,
                  "capabilities.json")
