"""An HF-faithful harness with bugs planted on purpose, for testing `chatgold explain`.

It is the reference renderer itself (runners.hf.HFRenderer: transformers' apply_chat_template) with the
bugs named on the command line switched on in the jinja2 environment transformers builds for each template:

  tojson-sorts-keys   the tojson filter sorts object keys (json.dumps(sort_keys=True))
  trim-does-nothing   the trim filter returns a string unchanged
  no-string-test      the `string` test is missing (the template fails to compile where it uses `is string`)

With no bug it must match every golden.

    python tests/harnesses/planted.py [--bug NAME]...
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _sorted_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=True)


def _trim_nothing(value, chars=None):
    # Strings come back untouched; anything else is trimmed as jinja2 does (its string form, stripped), so the
    # bug shows one way only: whitespace left in place.
    from jinja2.filters import do_trim

    return value if isinstance(value, str) else do_trim(value, chars)


def _plant(env, bugs) -> None:
    if "tojson-sorts-keys" in bugs:
        env.filters["tojson"] = _sorted_tojson
    if "trim-does-nothing" in bugs:
        env.filters["trim"] = _trim_nothing
    if "no-string-test" in bugs:
        env.tests.pop("string", None)


BUGS = ("tojson-sorts-keys", "trim-does-nothing", "no-string-test")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", action="append", default=[], choices=BUGS)
    bugs = frozenset(parser.parse_args().bug)

    from transformers.utils import chat_template_utils

    from runners.harness import serve
    from runners.hf import HFRenderer

    base = chat_template_utils.ImmutableSandboxedEnvironment

    class PlantedEnvironment(base):
        # transformers sets its own tojson right before from_string: plant the bugs after that.
        def from_string(self, source, *args, **kwargs):
            _plant(self, bugs)
            return super().from_string(source, *args, **kwargs)

    chat_template_utils.ImmutableSandboxedEnvironment = PlantedEnvironment
    renderer = HFRenderer()
    name = "planted" + "".join(f"+{bug}" for bug in sorted(bugs))
    # The build identity promises that outcomes are a function of it and the inputs (explain caches by it).
    serve({"name": name, "version": renderer.version, "language": "python",
           "homepage": "tests/harnesses/planted.py"}, renderer.render, build=f"{name} transformers {renderer.version}")


if __name__ == "__main__":
    main()
