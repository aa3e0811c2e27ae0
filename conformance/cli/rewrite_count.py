"""`python -m conformance.cli.rewrite_count`: compat's `--fix` over the corpus (a seeded random order; --limit N
for a sample), one JSON line per template, then the totals."""
import argparse
import json
import sys

from conformance.analysis.rewrites import corpus_count
from conformance.checkrun import CheckRun, ExplainOptions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.cli.rewrite_count",
                                     description="--fix over the corpus (a seeded random order; --limit N for a sample)")
    parser.add_argument("--engines", default="minijinja,tgi,mistralrs")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--part", default="1/1", metavar="I/N", help="the I-th of N interleaved parts")
    parser.add_argument("--rewrites", default="", metavar="NAME,...",
                        help="only the templates where one of these rewrites has a site, and only these tried")
    args = parser.parse_args(argv)
    try:
        index, count = (int(x) for x in args.part.split("/"))
        if not 1 <= index <= count:
            raise ValueError
    except ValueError:
        parser.error(f"--part {args.part!r}: expected I/N with 1 <= I <= N")
    from conformance.analysis.rewrites import REWRITES

    only = tuple(name for name in args.rewrites.split(",") if name)
    unknown = sorted(set(only) - {r.name for r in REWRITES})
    if unknown:
        parser.error(f"--rewrites: unknown rewrite(s) {', '.join(unknown)}; known: "
                     f"{', '.join(r.name for r in REWRITES)}")
    print(json.dumps(corpus_count(args.engines.split(","), CheckRun, ExplainOptions, args.seed, args.limit,
                                  sys.stdout, (index, count), only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
