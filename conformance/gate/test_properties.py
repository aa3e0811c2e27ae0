"""Gate: the reference still derives each template's stored property record (goldens/<id>/properties.json)."""
from __future__ import annotations

import pytest

from conformance.analysis.properties import (
    encode_properties,
    load_properties,
    properties_path,
)
from conformance.gate.plugin import PROPERTIES_JOB
from conformance.gate.records import check_derived, check_present

pytestmark = pytest.mark.chatgold_gate


@pytest.mark.chatgold_renders(PROPERTIES_JOB)
def test_reference_reproduces_properties(chatgold_session, chatgold_template):
    """Prefix stability, generation prompt, marker balance, repr leaks, time invariance, determinism and
    faithfulness, checked again through the pinned reference, give exactly the stored record."""
    results, failures = chatgold_session.properties()
    check_derived(chatgold_template, results, failures, load_properties(chatgold_template),
                  properties_path(chatgold_template), encode_properties, "chatgold properties update")


def test_every_template_has_properties(chatgold_session):
    """Every selected template carries a property record that is valid JSON in canonical form."""
    check_present([t.id for t in chatgold_session.templates], properties_path, encode_properties, "properties.json")
