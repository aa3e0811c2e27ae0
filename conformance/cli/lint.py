"""`chatgold lint TEMPLATE|GGUF|tokenizer_config.json`: the golden-free properties on one file's template(s).

For a model publisher: the templates are read like `chatgold render --template-file` reads them (special
tokens from the file when it has them), every property runs through the reference, and each violation is
printed with its two-line explanation, minimal case and evidence, and its class (analysis/findings.py): a
violation breaks the model; a capability is an input the template does not take (shown with the inputs);
design is the format's own choice (a turn kept open across tool calls). Exit 1 on a violation, 0 when there
is none (capabilities and design do not fail), 2 on bad input (unreadable file, no template, not UTF-8, not
valid Jinja)."""
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


def _print_record(template: _Template, record: dict, findings: list, cases_dir: Path, stream) -> None:
    from conformance.analysis.properties import PROPERTY_IDS

    classes = {cls: sum(1 for f in findings if f["class"] == cls) for cls in ("violation", "capability", "design")}
    print(f"{template.id} (bos {template.bos_token!r}, eos {template.eos_token!r}): {classes['violation']} "
          f"violation(s), {classes['capability']} capability finding(s), {classes['design']} design finding(s); "
          f"{len(record['violated'])} of {len(PROPERTY_IDS)} properties with a finding; "
          f"{record['renders']['rendered']} of {record['renders']['cases']} cases render, "
          f"{record['renders']['raised']} raise", file=stream)
    labels = {"violation": "VIOLATION", "capability": "capability", "design": "design"}
    for name in PROPERTY_IDS:
        result = record["properties"][name]
        mine = [f for f in findings if f["property"] == name]
        status = result["status"]
        if mine:
            status = labels["violation"] if any(f["class"] == "violation" for f in mine) else \
                " and ".join(sorted({f["class"] for f in mine}))
        print(f"  {name}: {status} ({result['checked']} checked)" + (f"; {result['note']}" if result.get("note") else ""),
              file=stream)
        for finding in mine:
            where = f", template line {finding['line']}" if finding.get("line") else ""
            print(f"    [{finding['kind']}] {labels[finding['class']]} in {finding['count']} case(s){where}", file=stream)
            if finding.get("inputs"):
                print(f"      inputs: {finding['inputs']}", file=stream)
            for line in finding["explanation"]:
                print(f"      {line}", file=stream)
            print(f"      minimal case: {finding['case']} ({cases_dir / (finding['case'] + '.json')})", file=stream)
            print(f"      evidence: {json.dumps(finding['evidence'], ensure_ascii=False)}", file=stream)
        for finding in result["exceptions"]:
            print(f"    intended exception [{finding['kind']}] in {finding['count']} case(s): "
                  f"{finding['explanation'][1]}", file=stream)


def cmd_lint(args) -> int:
    from conformance.corpus.cases import CASES_DIR

    path = Path(args.path)
    from conformance.analysis.findings import lint_templates

    templates = templates_from_file(path, args.template_name, args.bos, args.eos)
    results, findings = lint_templates(templates, args.workers)
    violated = any(f["class"] == "violation" for t in templates for f in findings[t.id])
    data = {"file": str(path), "violated": violated,
            "templates": [{"name": t.id, "bos_token": t.bos_token, "eos_token": t.eos_token,
                           "properties": results[t.id], "findings": findings[t.id]} for t in templates]}
    fmt = "json" if args.json else args.format
    if fmt == "json":
        text = json.dumps(data, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    elif fmt == "sarif":
        from conformance.report.sarif import lint_sarif

        text = json.dumps(lint_sarif(data, args.path), ensure_ascii=False, indent=1) + "\n"
    else:
        text = None
    if text is not None and args.out:
        from conformance.cli.compat import write_output

        write_output(text, args.out)
    elif text is not None:
        sys.stdout.write(text)
    if text is None or args.out:
        stream = sys.stdout if text is None else sys.stderr
        for template in templates:
            _print_record(template, results[template.id], findings[template.id], CASES_DIR, stream)
    return EXIT_FAIL if violated else EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("lint", help="check one file's chat template(s) for golden-free properties (exit 1 on a "
                                    "violation)",
                       description="Runs prefix stability, generation prompt, marker balance, repr leaks, time "
                                   "invariance, determinism and faithfulness through the reference on the "
                                   "template(s) of a .jinja, tokenizer_config.json, chat_template.json or .gguf. "
                                   "Each finding is a violation (breaks the model), a capability (an input "
                                   "the template does not take) or design (the format's own choice). Exit 0: no "
                                   "violation; 1: a violation; 2: bad input.")
    p.add_argument("path", metavar="TEMPLATE|GGUF|tokenizer_config.json")
    p.add_argument("--template-name", metavar="NAME", help="only this named variant inside the file (tool_use, ...)")
    p.add_argument("--bos", metavar="TEXT", help="bos_token text (overrides the file's)")
    p.add_argument("--eos", metavar="TEXT", help="eos_token text (overrides the file's)")
    p.add_argument("--json", action="store_true", help="print the property records and classified findings as "
                                                         "JSON (the same as --format json)")
    p.add_argument("--format", choices=("terminal", "json", "sarif"), default="terminal",
                   help="output format (default terminal); sarif: SARIF 2.1.0 for code scanning")
    p.add_argument("--out", metavar="FILE", help="write the JSON or SARIF here (the terminal text goes to stderr)")
    p.add_argument("--workers", type=int, default=2, help="reference harness processes (default 2)")
    p.set_defaults(func=cmd_lint)
