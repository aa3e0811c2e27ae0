"""The options the commands that check engines share (selection, outputs, baselines, the result store,
root causes), and what they build from parsed arguments."""
from __future__ import annotations

from pathlib import Path

from conformance.cli.common import UserError


def add_selection(p, workers: bool = True) -> None:
    p.add_argument("--template", action="append", default=[], metavar="GLOB",
                   help="template ids to include (repeatable; case-insensitive)")
    p.add_argument("--case", action="append", default=[], metavar="GLOB",
                   help="case ids to include (repeatable; case-insensitive)")
    p.add_argument("--feature", action="append", default=[], metavar="TAG", help="only cases with this feature tag")
    p.add_argument("--shard", metavar="I/N", help="shard I of N (whole templates per shard)")
    if workers:
        p.add_argument("--workers", type=int, default=2, help="engine processes per runner (default 2)")
        p.add_argument("--timeout", type=float, default=20.0, metavar="S",
                       help="seconds one render may take before the cell is a timeout (default 20)")


def add_outputs(p) -> None:
    p.add_argument("--junit", metavar="PATH", help="JUnit XML: one test case per runner x template (with its unexpected cells) and per "
                                             "new, fixed or moved root cause")
    p.add_argument("--markdown", metavar="PATH", help="Markdown summary (GitHub step summary / PR comment)")
    p.add_argument("--badges", metavar="DIR", help="shields.io endpoint badge JSON per runner")
    p.add_argument("--html", metavar="PATH", help="static self-contained HTML report")


def add_expectations_dir(p) -> None:
    p.add_argument("--expectations", metavar="DIR", type=Path,
                   help="directory of known-divergence baselines (<runner>.json); default $CHATGOLD_EXPECTATIONS_DIR, "
                        "else for a runner the suite ships its own (conformance/expectations; `expectations update` "
                        "then needs the folder named), for a command: harness ./chatgold-expectations (never the "
                        "suite's)")


def selection_from_args(args):
    from conformance.judge.pipeline import Selection

    selection = Selection.load(args.template, args.case, args.feature, args.shard)
    if not selection.templates or not selection.cases:
        raise UserError("the selection has no cells (no template or no case matches)")
    return selection


def open_runner(spec: str, args):
    from runners import get_runner

    return get_runner(spec, workers=args.workers, timeout=args.timeout)


def add_cache_option(p) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="render every cell again instead of reusing outcomes from the result store (`chatgold "
                        "cache stats`; the fresh outcomes replace what it held), and reduce root causes afresh "
                        "without the root-cause cache")


def store_from_args(args):
    """The result store the command reads first (render/store.py), with whether to refresh it."""
    from conformance.render.store import ResultStore

    return ResultStore(), bool(getattr(args, "no_cache", False))


def add_explain_options(p) -> None:
    p.add_argument("--no-explain", action="store_true",
                   help="do not look for root causes (chatgold explain) of cells the baseline does not know")
    add_reduction_limits(p)


def add_reduction_limits(p) -> None:
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="candidate renders one reduction may spend (default 1500)")
    p.add_argument("--max-groups-per-template", dest="max_groups", type=int, default=None, metavar="N",
                   help="reduce at most N (template, symptom) groups per template, the largest first; the other "
                        "groups' cells are listed unexplained (default: no limit)")
