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
    args = parser.parse_args(argv)
    print(json.dumps(corpus_count(args.engines.split(","), CheckRun, ExplainOptions, args.seed, args.limit,
                                  sys.stdout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
