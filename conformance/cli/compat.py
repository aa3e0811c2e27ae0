"""`chatgold compat TEMPLATE|GGUF|tokenizer_config.json`: one template through every engine, on every case.

For a model publisher: the reference renders the template first (its outcomes are this run's goldens, held in
memory), then each selected engine renders the same cases through one CheckRun; per engine the cases it
renders right, those that differ, those it refuses, each difference with the engine's known cause when its
baseline has one (conformance/analysis/compat.py). Exit 0 only when every selected engine renders every case
right, 1 otherwise, 2 on bad input."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError

FORMATS = ("terminal", "json", "markdown", "html", "sarif")


def engines_from_args(values) -> list:
    from conformance.analysis.compat import DEFAULT_ENGINES
    from runners import REFERENCE_RUNNER, runner_names

    if not values:
        return list(DEFAULT_ENGINES)
    engines = []
    for value in values:
        for spec in (s.strip() for s in value.split(",")):
            if not spec:
                continue
            if spec == REFERENCE_RUNNER:
                continue  # the reference always renders: it is what the others are held against
            if not spec.startswith("command:") and spec.partition("@")[0] not in runner_names():
                raise UserError(f"--engines: unknown engine {spec!r}; known: {', '.join(runner_names())}")
            if spec not in engines:
                engines.append(spec)
    if not engines:
        raise UserError("--engines: no engine besides the reference selected")
    return engines


def compat_record(path: Path, args, log=None) -> dict:
    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.cli.lint import templates_from_file
    from conformance.cli.options import store_from_args

    templates = templates_from_file(path, args.template_name, args.bos, args.eos)
    store, refresh = store_from_args(args)
    options = CompatOptions(engines=engines_from_args(args.engines), workers=args.workers, timeout=args.timeout,
                            reduce=args.reduce, budget=args.budget, max_groups=args.max_groups, store=store,
                            refresh=refresh, expectations_dir=args.expectations, log=log)
    records = [compat(UserTemplate(t.id, t.text, t.bos_token, t.eos_token), options, CheckRun, ExplainOptions)
               for t in templates]
    return {"format": 1, "file": str(path), "engines": list(options.engines), "templates": records,
            "renders_right_everywhere": all(r["renders_right_everywhere"] for r in records)}


def render_output(record: dict, fmt: str, path: str) -> str:
    from conformance.report import compat as writers
    from conformance.report.sarif import compat_sarif

    if fmt == "json":
        return json.dumps(record, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    if fmt == "markdown":
        return writers.markdown(record)
    if fmt == "html":
        return writers.html(record)
    if fmt == "sarif":
        return json.dumps(compat_sarif(record, path), ensure_ascii=False, indent=1) + "\n"
    return writers.terminal(record) + "\n"


def write_output(text: str, out) -> None:
    if out:
        from conformance.files import atomic_write

        atomic_write(Path(out), text.encode("utf-8"))
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def cmd_compat(args) -> int:
    path = Path(args.path)
    record = compat_record(path, args, log=lambda line: print(f"chatgold compat: {line}", file=sys.stderr))
    write_output(render_output(record, args.format, args.path), args.out)
    if args.out and args.format != "terminal":
        print(render_output(record, "terminal", args.path), end="", file=sys.stderr)
    return EXIT_OK if record["renders_right_everywhere"] else EXIT_FAIL


def register(sub) -> None:
    from conformance.analysis.compat import DEFAULT_ENGINES
    from conformance.cli.options import add_cache_option, add_expectations_dir

    p = sub.add_parser("compat", help="render one file's chat template(s) through every engine on every case "
                                      "(exit 1 unless every engine renders every case right)",
                       description="The reference renders the template of a .jinja, tokenizer_config.json, "
                                   "chat_template.json or .gguf on every case; each engine renders the same cases "
                                   "and is reported per case as right, differing, refusing, without an answer or "
                                   "not run, each difference with the engine's known cause from its baseline. "
                                   "Exit 0: every selected engine renders every case right; 1: one does not; "
                                   "2: bad input.")
    p.add_argument("path", metavar="TEMPLATE|GGUF|tokenizer_config.json")
    p.add_argument("--engines", action="append", metavar="E[,E...]",
                   help=f"engines to run (comma-separated or repeated; default {','.join(DEFAULT_ENGINES)}; the "
                        "reference hf always renders)")
    p.add_argument("--format", choices=FORMATS, default="terminal", help="output format (default terminal)")
    p.add_argument("--out", metavar="FILE", help="write the output here instead of stdout")
    p.add_argument("--template-name", metavar="NAME", help="only this named variant inside the file (tool_use, ...)")
    p.add_argument("--bos", metavar="TEXT", help="bos_token text (overrides the file's)")
    p.add_argument("--eos", metavar="TEXT", help="eos_token text (overrides the file's)")
    p.add_argument("--reduce", action="store_true",
                   help="reduce differences no known cause explains to a minimal reproducer (bounded by --budget "
                        "and --max-groups)")
    p.add_argument("--budget", type=int, default=300, metavar="N", help="candidate renders per reduction (default 300)")
    p.add_argument("--max-groups", type=int, default=3, metavar="N",
                   help="reduce at most N symptom groups per engine (default 3)")
    p.add_argument("--workers", type=int, default=2, help="engine processes per runner (default 2)")
    p.add_argument("--timeout", type=float, default=20.0, metavar="S", help="seconds per render (default 20)")
    add_expectations_dir(p)
    add_cache_option(p)
    p.set_defaults(func=cmd_compat)
