"""`chatgold corpus ...`: the template corpus (templates/): list, build, fetch, import, families, diff."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.cli.common import EXIT_OK


def cmd_corpus_list(args) -> int:
    from conformance.analysis.properties import (
        load_properties,
        property_line,
        property_summary,
    )
    from conformance.corpus.manifest import load_corpus

    corpus = load_corpus()
    entries = corpus.select(args.template)
    if args.json:
        # Each entry as in the manifest, plus which unknown special tokens its goldens depend on and its
        # golden-free property results.
        rows = [{**e.to_dict(), "depends_on_unknown_token": corpus.depends_on_unknown_token(e),
                 "properties": property_summary(load_properties(e.id))} for e in entries]
        json.dump(rows, sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    if args.constructs:
        from conformance.corpus.manifest import load_constructs

        construct_table = load_constructs(corpus.root)
    if args.capabilities:
        from conformance.analysis.capabilities import load_capabilities
    depending = 0
    for entry in entries:
        origin = entry.origins[0]
        where = origin["path"] + (f" [{origin['key']}]" if origin.get("key") else "")
        more = f" (+{len(entry.origins) - 1} more)" if len(entry.origins) > 1 else ""
        print(f"{entry.id}  sha256:{entry.sha256[:12]}  family:{entry.family}  variant:{entry.variant}"
              f"{'  generic' if entry.generic else ''}")
        if entry.former_ids:
            print(f"    aliases (former ids): {', '.join(entry.former_ids)}")
        print(f"    from {origin['source']}: {where}{more}")
        print(f"    bos={entry.bos_token!r} ({entry.bos_source})  eos={entry.eos_token!r} ({entry.eos_source})")
        print(f"    add_bos_token={_flag(entry.add_bos_token)}  add_eos_token={_flag(entry.add_eos_token)}")
        unknown = corpus.depends_on_unknown_token(entry)
        if unknown:
            depending += 1
            print(f"    goldens depend on an unknown token: {', '.join(unknown)}")
        print(f"    properties: {property_line(load_properties(entry.id))}")
        if args.constructs:
            names = construct_table.get(entry.sha256, ["(not recorded: run `chatgold corpus build`)"])
            print(f"    constructs: {', '.join(names)}")
        if args.capabilities:
            caps = load_capabilities(entry.id)
            print(f"    capabilities: {json.dumps(caps, ensure_ascii=False, sort_keys=True) if caps else 'none recorded'}")
    unknown_entries = sum(1 for e in entries if e.unknown_tokens())
    print(f"{len(entries)} templates, {len({e.sha256 for e in entries})} unique sha256; {unknown_entries} with an "
          f"unknown bos/eos, {depending} whose goldens depend on one", file=sys.stderr)
    return EXIT_OK


def _flag(value) -> str:
    return "unknown" if value is None else str(value).lower()


def cmd_corpus_build(args) -> int:
    from conformance.corpus.manifest import build_corpus

    corpus = build_corpus(progress=lambda line: print(line, file=sys.stderr))
    print(f"corpus: {len(corpus.entries)} unique templates from {len(corpus.sources)} sources")
    return EXIT_OK


def cmd_corpus_fetch(args) -> int:
    from conformance.corpus.sources import all_sources, source_root

    for source in all_sources():
        print(f"{source.id}: {source_root(source)}")
    return EXIT_OK


def cmd_corpus_import(args) -> int:
    from conformance.corpus.manifest import import_files

    added = import_files([Path(p) for p in args.paths])
    for entry in added:
        print(f"added {entry.id} (sha256 {entry.sha256[:12]}, family {entry.family})")
    if not added:
        print("nothing new: every template is already in the corpus")
    return EXIT_OK


def cmd_families(args) -> int:
    from conformance.corpus.families import group_variants, jaccard, shingles
    from conformance.corpus.manifest import load_corpus

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
            score = jaccard(base, shingles(entry.source()))
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


def register(sub) -> None:
    corpus = sub.add_parser("corpus", help="the template corpus (templates/)").add_subparsers(
        dest="corpus_command", metavar="ACTION", required=True)
    p = corpus.add_parser("list", help="list templates with provenance, aliases, bos/eos evidence and unknown-token dependence")
    p.add_argument("--template", action="append", metavar="GLOB", help="only ids matching GLOB (repeatable)")
    p.add_argument("--json", action="store_true", help="print manifest entries as JSON")
    p.add_argument("--constructs", action="store_true", help="also list each template's Jinja constructs")
    p.add_argument("--capabilities", action="store_true", help="also show each template's capability golden")
    p.set_defaults(func=cmd_corpus_list)
    p = corpus.add_parser("build", help="re-create the corpus from its pinned sources (downloads into the cache)")
    p.set_defaults(func=cmd_corpus_build)
    p = corpus.add_parser("fetch", help="download and verify every pinned source into the cache (no corpus change)")
    p.set_defaults(func=cmd_corpus_fetch)
    p = corpus.add_parser("import", help="add templates from .jinja, tokenizer_config.json, chat_template.json or .gguf files")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_corpus_import)
    from conformance.corpus.families import (
        ACROSS_FAMILY_THRESHOLD,
        WITHIN_FAMILY_THRESHOLD,
    )

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
