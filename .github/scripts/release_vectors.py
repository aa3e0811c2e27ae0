"""The release job's vectors step: export the test vectors, prove the export deterministic, write their checksum
and the reference versions.

    python .github/scripts/release_vectors.py --out dist [--template GLOB ...] [--case GLOB ...]

Writes into --out: vectors.jsonl.gz (docs/vectors.md), vectors.jsonl.gz.sha256 (`sha256sum -c` format),
vectors.reference.json (format, reference versions, counts, sha256) and release-notes.md. Exits 1 when two
exports of the same goldens differ by a byte (the checksum would then mean nothing).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile

from conformance.cli import main as chatgold

NAME = "vectors.jsonl.gz"


def export(path: str, selection: list) -> None:
    code = chatgold(["export", "--out", path, *selection])
    if code != 0:
        raise SystemExit(code)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="dist", help="directory for the release assets")
    parser.add_argument("--template", action="append", default=[], metavar="GLOB")
    parser.add_argument("--case", action="append", default=[], metavar="GLOB")
    args = parser.parse_args(argv)
    selection = [a for g in args.template for a in ("--template", g)] + [a for g in args.case for a in ("--case", g)]
    os.makedirs(args.out, exist_ok=True)
    vectors = os.path.join(args.out, NAME)
    export(vectors, selection)
    with tempfile.TemporaryDirectory() as scratch:
        again = os.path.join(scratch, NAME)
        export(again, selection)
        with open(vectors, "rb") as first, open(again, "rb") as second:
            if first.read() != second.read():
                print(f"{vectors}: two exports of the same goldens differ; not publishing", file=sys.stderr)
                return 1
    with open(vectors, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    with gzip.open(vectors, "rt", encoding="utf-8") as handle:
        header = json.loads(handle.readline())
    with open(vectors + ".sha256", "w", encoding="utf-8") as handle:
        handle.write(f"{digest}  {NAME}\n")
    reference = {"file": NAME, "sha256": digest, "format": header["format"], "reference": header["reference"],
                 "cells": header["cells"], "templates": header["templates"], "cases": header["cases"],
                 "semantics": header["semantics"]}
    with open(os.path.join(args.out, "vectors.reference.json"), "w", encoding="utf-8") as handle:
        json.dump(reference, handle, indent=1, sort_keys=True)
        handle.write("\n")
    versions = ", ".join(f"{k} {v}" for k, v in header["reference"].items())
    with open(os.path.join(args.out, "release-notes.md"), "w", encoding="utf-8") as handle:
        handle.write(f"Test vectors (format {header['format']}): {header['cells']} cells, {header['templates']} "
                     f"templates x {header['cases']} cases, every expected value rendered by {versions}.\n\n"
                     f"`{NAME}` sha256 `{digest}`. How to run them without Python: docs/vectors.md; what the "
                     f"reference does: {header['semantics']}.\n")
    print(f"{vectors}: sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
