"""Example harnesses: small, faithful reproductions of renderers our users run (seed documents 000, 001, 003),
each a standalone program speaking the harness protocol, reached through the command runner.

- ferrox: a Rust server's minijinja evaluator, configured exactly as its chat_template.rs describes (seed 000);
- chatml-builtin: a hand-written ChatML renderer that ignores the template (seed 001);
- paperkiln: a record-based C++ renderer that resolves a record instead of evaluating Jinja (seed 003).

And the engine author's starting points (docs/engine-authors.md), which use nothing of chatgold:

- harness.mjs + hfjs_engine.mjs: a protocol-2 harness in JavaScript on @huggingface/jinja (the `hfjs` runner
  runs it too);
- minimal_harness.py + plain_jinja2.py: a protocol-2 harness in Python, the engine being jinja2 with the rules
  of runners/protocol/SEMANTICS.md;
- vectors_jinja2.py, vectors_hfjs.mjs: consumers of the exported test vectors (docs/vectors.md).
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
