"""Ollama's choice for every corpus template (runners/ollama/selection.py): counts by route and Go template,
and with --json the per-template facts (ollama.route, ollama.template, ollama.distance).

    python scripts/ollama_choices.py [--json PATH] [--workers N]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.corpus.manifest import load_corpus  # noqa: E402
from runners.ollama import selection  # noqa: E402


def _facts(text: str) -> dict:
    return selection.choose(text).facts()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write {template id: facts} here")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    entries = load_corpus().select()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        facts = dict(zip((e.id for e in entries), pool.map(_facts, (e.source() for e in entries), chunksize=8)))
    routes = Counter(f["ollama.route"] for f in facts.values())
    print(f"{len(facts)} templates: " + ", ".join(f"{n} {route}" for route, n in routes.most_common()))
    chosen = Counter((f["ollama.route"], f["ollama.template"]) for f in facts.values() if f["ollama.template"])
    for (route, name), n in chosen.most_common():
        print(f"  {route:15} {name:24} {n}")
    if args.json:
        args.json.write_text(json.dumps(dict(sorted(facts.items())), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
