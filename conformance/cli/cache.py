"""`chatgold cache stats|prune|clear|key`: the result store (conformance/render/store.py)."""
from __future__ import annotations

import json

from conformance.cli.common import EXIT_OK


def _store(args):
    from conformance.render.store import ResultStore

    return ResultStore(verbose=False)


def _megabytes(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


def cmd_stats(args) -> int:
    stats = _store(args).stats()
    if args.json:
        print(json.dumps(stats, indent=1, sort_keys=True))
        return EXIT_OK
    print(f"{stats['root']}: {stats['entries']} outcomes in {stats['packs']} packs, {_megabytes(stats['bytes'])} "
          f"(bound {_megabytes(stats['max_bytes'])})")
    rows = sorted(stats["identities"].items(), key=lambda item: item[1]["last_used"], reverse=True)
    for digest, row in rows:
        identity = row["identity"] or {}
        version = identity.get("version") or identity.get("tag") or identity.get("package") or ""
        label = f"{identity.get('name', '?')} {version}".strip()
        print(f"  {digest[:12]}  {label[:48]:48}  {row['entries']:>8} outcomes  {row['packs']:>5} packs  "
              f"{_megabytes(row['bytes']):>9}  last used {row['last_used']}")
    return EXIT_OK


def cmd_prune(args) -> int:
    from conformance.render.store import megabytes_to_bytes

    store = _store(args)
    limit = megabytes_to_bytes(args.max_mb, "--max-mb") if args.max_mb is not None else None
    done = store.prune(limit)
    print(f"{store.root}: removed {done['removed_packs']} packs ({_megabytes(done['freed_bytes'])}); "
          f"{_megabytes(done['bytes'])} left (bound {_megabytes(done['max_bytes'])})")
    return EXIT_OK


def cmd_clear(args) -> int:
    store = _store(args)
    print(f"{store.root}: removed {store.clear()} packs")
    return EXIT_OK


def runner_identities(specs) -> dict:
    """spec -> identity (or why there is none), asking each runner once."""
    from runners import get_runner
    from runners.base import RunnerUnavailable

    found = {}
    for spec in specs:
        try:
            runner = get_runner(spec, workers=1)
        except RunnerUnavailable as exc:
            found[spec] = {"unavailable": str(exc)}
            continue
        try:
            found[spec] = runner.identity()
        finally:
            runner.close()
    return found


def cmd_key(args) -> int:
    """A short key for the outcomes these runners give: it changes when any runner's identity does (a CI
    cache keyed by it is saved again exactly when there are new outcomes worth keeping)."""
    from conformance.render.store import identity_digest
    from runners import REFERENCE_RUNNER, runner_names

    specs = args.runner or [REFERENCE_RUNNER] + [name for name in runner_names() if name != REFERENCE_RUNNER]
    identities = runner_identities(specs)
    digests = {spec: identity_digest(identity) if identity else None for spec, identity in identities.items()}
    key = identity_digest({"runners": digests})[:args.length]
    if args.json:
        print(json.dumps({"key": key, "runners": identities, "digests": digests}, indent=1, sort_keys=True))
    else:
        print(key)
    return EXIT_OK


def register(sub) -> None:
    cache = sub.add_parser("cache", help="the result store: outcomes reused when runner, template and case are "
                                         "unchanged").add_subparsers(dest="cache_command", metavar="ACTION",
                                                                     required=True)
    p = cache.add_parser("stats", help="what the store holds, per runner identity")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=cmd_stats)
    p = cache.add_parser("prune", help="remove the least recently used packs down to the size bound")
    p.add_argument("--max-mb", default=None, metavar="MB",
                   help="size bound in megabytes (default: $CHATGOLD_RESULTS_MAX_MB, or 2048)")
    p.set_defaults(func=cmd_prune)
    p = cache.add_parser("clear", help="remove every stored outcome")
    p.set_defaults(func=cmd_clear)
    p = cache.add_parser("key", help="a key derived from the runners' identities (for CI caches)")
    p.add_argument("--runner", action="append", default=[], metavar="R",
                   help="runner spec (repeatable; default: the reference and every builtin and example runner)")
    p.add_argument("--length", type=int, default=16, help="hex digits of the key (default 16)")
    p.add_argument("--json", action="store_true", help="print every runner's identity as well")
    p.set_defaults(func=cmd_key)
