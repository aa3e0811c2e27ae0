"""Example harnesses: small, faithful reproductions of renderers our users run (from documents engines in the
field sent us), each a standalone program speaking the harness protocol, reached through the command runner.

- ferrox: a Rust server's minijinja evaluator, configured exactly as its chat_template.rs describes (seed 000);
- chatml-builtin: a hand-written ChatML renderer that ignores the template (seed 001);
- paperkiln: a record-based C++ renderer that resolves a record instead of evaluating Jinja (seed 003).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {
    "ferrox": "ferrox.py",
    "chatml-builtin": "chatml_builtin.py",
    "paperkiln": "paperkiln.py",
}


def example_argv(name: str) -> list[str]:
    """The command line that starts example harness `name`."""
    try:
        script = SCRIPTS[name]
    except KeyError:
        raise ValueError(f"unknown example harness {name!r}; known: {', '.join(SCRIPTS)}") from None
    return [sys.executable, os.path.join(HERE, script)]
