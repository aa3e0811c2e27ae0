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


def compat_record(path: Path, args, log=None) -> tuple:
    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.checkrun import CheckRun, ExplainOptions
    from conformance.cli.lint import templates_from_file
    from conformance.cli.options import store_from_args

    templates = templates_from_file(path, args.template_name, args.bos, args.eos)
    store, refresh = store_from_args(args)
    options = CompatOptions(engines=engines_from_args(args.engines), workers=args.workers, timeout=args.timeout,
                            reduce=args.reduce, budget=args.budget, max_groups=args.max_groups, store=store,
                            refresh=refresh, expectations_dir=args.expectations, log=log)
    if args.fix and len(templates) != 1:
        raise UserError(f"{path}: --fix rewrites one template; this file has {len(templates)} (choose one with "
                        f"--template-name)")
    records = [compat(UserTemplate(t.id, t.text, t.bos_token, t.eos_token), options, CheckRun, ExplainOptions)
               for t in templates]
    record = {"format": 1, "file": str(path), "engines": list(options.engines), "templates": records,
              "renders_right_everywhere": all(r["renders_right_everywhere"] for r in records)}
    fixed = None
    if args.fix:
        from dataclasses import replace

        from conformance.analysis.rewrites import fix

        [template] = templates
        quiet = replace(options, reduce=False, log=None)
        text, _, section = fix(template.text, records[0], lambda candidate: compat(
            UserTemplate(template.id, candidate, template.bos_token, template.eos_token), quiet, CheckRun,
            ExplainOptions))
        record["fix"] = {"out": args.fix if section["applied"] else None, **section}
        fixed = (template.text, text)
    return record, fixed


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
    if args.fix and Path(args.fix).resolve() == path.resolve():
        raise UserError(f"{args.fix}: --fix writes a new file; it will not overwrite the template it reads")
    record, fixed = compat_record(path, args, log=lambda line: print(f"chatgold compat: {line}", file=sys.stderr))
    if fixed is not None:
        _write_fix(record["fix"], *fixed, args.fix, path)
    write_output(render_output(record, args.format, args.path), args.out)
    if args.out and args.format != "terminal":
        print(render_output(record, "terminal", args.path), end="", file=sys.stderr)
    return EXIT_OK if record["renders_right_everywhere"] else EXIT_FAIL


def _write_fix(section: dict, before: str, after: str, out: str, path: Path) -> None:
    """Write the rewritten template (only when a rewrite was proven) and show the diff and the before/after
    table on stderr."""
    import difflib

    from conformance.files import atomic_write

    for entry in section["rejected"]:
        print(f"chatgold compat --fix: not applied: {entry['name']} ({entry['sites']} site(s)): {entry['why']}",
              file=sys.stderr)
    if not section["applied"]:
        print(f"chatgold compat --fix: no rewrite keeps the reference's bytes and makes an engine render more "
              f"cases right; {out} not written", file=sys.stderr)
        return
    atomic_write(Path(out), after.encode("utf-8"))
    sys.stderr.writelines(difflib.unified_diff(before.splitlines(True), after.splitlines(True), str(path), out))
    print("\nengine            right before  right after", file=sys.stderr)
    for engine, count in section["before"].items():
        print(f"{engine:<17} {count:>12}  {section['after'][engine]:>11}", file=sys.stderr)
    print(f"wrote {out}: " + ", ".join(f"{e['name']} ({e['sites']} site(s); " + ", ".join(
        f"{k} {v:+d}" for k, v in sorted(e["gained"].items())) + ")" for e in section["applied"]), file=sys.stderr)


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
    p.add_argument("--fix", metavar="OUT.jinja",
                   help="try the portable rewrites (conformance/analysis/rewrites.py) and write OUT.jinja with those "
                        "proven by rendering: the reference's bytes unchanged on every case, at least one engine "
                        "renders more cases right, none fewer; prints the diff and the before/after table (the "
                        "exit status is still the input template's)")
    p.add_argument("--workers", type=int, default=2, help="engine processes per runner (default 2)")
    p.add_argument("--timeout", type=float, default=20.0, metavar="S", help="seconds per render (default 20)")
    add_expectations_dir(p)
    add_cache_option(p)
    p.set_defaults(func=cmd_compat)
