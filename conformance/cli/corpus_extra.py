"""`chatgold corpus families` and `chatgold corpus diff A B`: variant families of the corpus, and how two differ."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _corpus_subparsers(subparsers) -> argparse._SubParsersAction:
    corpus = subparsers.choices.get("corpus")
    if corpus is None:
        raise RuntimeError("cli_corpus_extra: the `corpus` command must be registered first")
    for action in corpus._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("cli_corpus_extra: `corpus` has no sub-commands to extend")


def cmd_families(args) -> int:
    from conformance.corpus.manifest import load_corpus
    from conformance.corpus.families import _jaccard, group_variants, shingles

    corpus = load_corpus()
    entries = corpus.select(args.template)
    groups = group_variants(entries, within=args.within, across=args.across)
    groups = {k: v for k, v in groups.items() if len(v) >= args.min_size}
    if args.json:
        json.dump(groups, sys.stdout, indent=1)
        print()
        return 0
    by_id = {e.id: e for e in entries}
    grouped = sum(len(v) for v in groups.values())
    print(f"{len(groups)} variant groups holding {grouped} of {len(entries)} templates "
          f"(within a family >= {args.within}, across >= {args.across})")
    for key, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        family, representative = key.split("/", 1)
        base = shingles(by_id[representative].source())
        print(f"\n{key}  ({len(ids)} templates)")
        for template_id in sorted(ids, key=lambda i: (i != representative, i)):
            entry = by_id[template_id]
            score = _jaccard(base, shingles(entry.source()))
            marker = "*" if template_id == representative else " "
            print(f"  {marker} {score:5.3f}  {template_id}  [{entry.family}, {entry.variant}]")
    return 0


def _load_side(spec: str):
    """A corpus template id, or a path to a template file."""
    from conformance.corpus.manifest import CorpusError, load_corpus

    path = Path(spec)
    if path.is_file():
        return spec, path.read_bytes().decode("utf-8", "replace")
    corpus = load_corpus()
    try:
        entry = corpus.get(spec)
    except CorpusError:
        raise CorpusError(f"{spec!r} is neither a corpus template id nor a readable file") from None
    return entry.id, entry.source()


def cmd_diff(args) -> int:
    from conformance.corpus.families import diff_templates, similarity

    a_label, a_text = _load_side(args.a)
    b_label, b_text = _load_side(args.b)
    text = diff_templates(a_text, b_text, a_label, b_label, context=args.context)
    if not text:
        print(f"{a_label} and {b_label} are byte-identical")
        return 0
    print(f"# similarity {similarity(a_text, b_text):.3f} (token shingles, whitespace and trim markers ignored)")
    sys.stdout.write(text)
    return 1


def register(subparsers) -> None:
    from conformance.corpus.families import ACROSS_FAMILY_THRESHOLD, WITHIN_FAMILY_THRESHOLD

    corpus = _corpus_subparsers(subparsers)
    p = corpus.add_parser("families", help="group templates that are variants of one another")
    p.add_argument("template", nargs="*", help="template id patterns (fnmatch); default: the whole corpus")
    p.add_argument("--within", type=float, default=WITHIN_FAMILY_THRESHOLD,
                   help=f"similarity needed within one family (default {WITHIN_FAMILY_THRESHOLD})")
    p.add_argument("--across", type=float, default=ACROSS_FAMILY_THRESHOLD,
                   help=f"similarity needed across families (default {ACROSS_FAMILY_THRESHOLD})")
    p.add_argument("--min-size", type=int, default=2, help="hide groups smaller than this (default 2)")
    p.add_argument("--json", action="store_true", help="print {group: [ids]} as JSON")
    p.set_defaults(func=cmd_families)
    p = corpus.add_parser("diff", help="unified diff of two templates (ids or files); exit 1 when they differ")
    p.add_argument("a", help="template id or file")
    p.add_argument("b", help="template id or file")
    p.add_argument("-U", "--context", type=int, default=3, help="lines of context (default 3)")
    p.set_defaults(func=cmd_diff)
