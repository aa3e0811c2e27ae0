"""`chatgold lint TEMPLATE|GGUF|tokenizer_config.json`: the golden-free properties on one file's template(s).

For a model publisher: the templates are read like `chatgold render --template-file` reads them (special
tokens from the file when it has them), every property runs through the reference, and each violation is
printed with its two-line explanation, minimal case and evidence. Exit 1 on a violation, 0 when clean,
2 on bad input (unreadable file, no template, not UTF-8, not valid Jinja)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from conformance.cli.common import EXIT_FAIL, EXIT_OK, UserError


@dataclass(frozen=True)
class _Template:
    id: str
    text: str
    bos_token: Optional[str]
    eos_token: Optional[str]

    def source(self) -> str:
        return self.text


def templates_from_file(path: Path, name: Optional[str], bos: Optional[str], eos: Optional[str]) -> list[_Template]:
    from conformance.corpus.manifest import candidates_from_file, compile_check

    found = candidates_from_file(path)
    if name:
        found = [c for c in found if c.variant == name]
        if not found:
            raise UserError(f"{path}: no template named {name!r}")
    templates = []
    for candidate in found:
        label = candidate.name if len(found) == 1 else f"{candidate.name} [{candidate.variant}]"
        try:
            text = candidate.text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: template {label!r} is not UTF-8 (byte {exc.start})") from None
        try:
            compile_check(text)
        except SyntaxError as exc:
            raise UserError(f"{path}: template {label!r} is not valid Jinja: {exc}") from None
        templates.append(_Template(label, text, candidate.bos_token if bos is None else bos,
                                   candidate.eos_token if eos is None else eos))
    return templates


def _print_record(template: _Template, record: dict, cases_dir: Path, stream) -> None:
    from conformance.analysis.properties import PROPERTY_IDS

    violated = record["violated"]
    print(f"{template.id} (bos {template.bos_token!r}, eos {template.eos_token!r}): {len(violated)} of "
          f"{len(PROPERTY_IDS)} properties violated; {record['renders']['rendered']} of "
          f"{record['renders']['cases']} cases render, {record['renders']['raised']} raise", file=stream)
    for name in PROPERTY_IDS:
        result = record["properties"][name]
        head = f"  {name}: {result['status'].upper() if result['status'] == 'violation' else result['status']}"
        print(f"{head} ({result['checked']} checked)" + (f"; {result['note']}" if result.get("note") else ""),
              file=stream)
        for finding in result["violations"]:
            print(f"    [{finding['kind']}] in {finding['count']} case(s)", file=stream)
            for line in finding["explanation"]:
                print(f"      {line}", file=stream)
            print(f"      minimal case: {finding['case']} ({cases_dir / (finding['case'] + '.json')})", file=stream)
            print(f"      evidence: {json.dumps(finding['evidence'], ensure_ascii=False)}", file=stream)
        for finding in result["exceptions"]:
            print(f"    intended exception [{finding['kind']}] in {finding['count']} case(s): "
                  f"{finding['explanation'][1]}", file=stream)


def cmd_lint(args) -> int:
    from conformance.analysis.properties import compute_properties
    from conformance.corpus.cases import CASES_DIR
    from runners import REFERENCE_RUNNER, get_runner

    path = Path(args.path)
    templates = templates_from_file(path, args.template_name, args.bos, args.eos)
    runner = get_runner(REFERENCE_RUNNER, workers=args.workers)
    try:
        results, failures = compute_properties(templates, runner)
    finally:
        runner.close()
    if failures:
        # the reference itself crashed or timed out on this template: nothing can be said about it
        raise UserError("; ".join(f"{template_id}: the reference failed: {message}" for template_id, message in failures))
    violated = any(results[t.id]["violated"] for t in templates)
    if args.json:
        json.dump({"file": str(path), "violated": violated,
                   "templates": [{"name": t.id, "bos_token": t.bos_token, "eos_token": t.eos_token,
                                  "properties": results[t.id]} for t in templates]},
                  sys.stdout, ensure_ascii=False, sort_keys=True, indent=1)
        sys.stdout.write("\n")
    else:
        for template in templates:
            _print_record(template, results[template.id], CASES_DIR, sys.stdout)
    return EXIT_FAIL if violated else EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("lint", help="check one file's chat template(s) for golden-free properties (exit 1 on a "
                                    "violation)",
                       description="Runs prefix stability, generation prompt, marker balance, repr leaks, time "
                                   "invariance, determinism and faithfulness through the reference on the "
                                   "template(s) of a .jinja, tokenizer_config.json, chat_template.json or .gguf. "
                                   "Exit 0: clean; 1: a property is violated; 2: bad input.")
    p.add_argument("path", metavar="TEMPLATE|GGUF|tokenizer_config.json")
    p.add_argument("--template-name", metavar="NAME", help="only this named variant inside the file (tool_use, ...)")
    p.add_argument("--bos", metavar="TEXT", help="bos_token text (overrides the file's)")
    p.add_argument("--eos", metavar="TEXT", help="eos_token text (overrides the file's)")
    p.add_argument("--json", action="store_true", help="print the property records as JSON")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_lint)
