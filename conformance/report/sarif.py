"""SARIF 2.1.0 of `chatgold lint` and `chatgold compat`, for code scanning (GitHub shows each result as an
annotation on the template's line).

Locations: a template read from a .jinja file is located on its own line; a template inside a
tokenizer_config.json, chat_template.json or GGUF has no line of its own in that file, so the result names the
file and says the template line in its message. Reads records only (no engine, no golden)."""
from __future__ import annotations

from typing import Optional

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_URI = "https://github.com/chatgold/chatgold"

# lint finding classes -> SARIF level (violations fail the build, capabilities and design are shown)
LINT_LEVELS = {"violation": "error", "capability": "note", "design": "note"}


def _uri(path: str) -> str:
    return path.replace("\\", "/")


def _location(path: str, line: Optional[int]) -> dict:
    physical: dict = {"artifactLocation": {"uri": _uri(path)}}
    if line and _is_template_file(path):
        physical["region"] = {"startLine": int(line)}
    return {"physicalLocation": physical}


def _is_template_file(path: str) -> bool:
    return not path.lower().endswith((".json", ".gguf"))


def _where(path: str, line: Optional[int], template: str) -> str:
    if line and not _is_template_file(path):
        return f" (template {template}, line {line})"
    return ""


def _log(rules: list, results: list, version: str, notifications: Optional[list] = None) -> dict:
    run: dict = {"tool": {"driver": {"name": "chatgold", "informationUri": TOOL_URI, "version": version,
                                     "rules": rules}},
                 "columnKind": "unicodeCodePoints", "results": results}
    if notifications:
        # what was not checked, for SARIF readers that show a run's notifications (results carry it too)
        run["invocations"] = [{"executionSuccessful": True, "toolExecutionNotifications": notifications}]
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("chatgold")
    except Exception:  # not installed as a distribution (a checkout on PYTHONPATH)
        return "0"


def _rule_index(rules: list, index: dict, rule_id: str, short: str, full: str, level: str) -> int:
    if rule_id not in index:
        index[rule_id] = len(rules)
        rules.append({"id": rule_id, "shortDescription": {"text": short}, "fullDescription": {"text": full},
                      "defaultConfiguration": {"level": level}})
    return index[rule_id]


def lint_sarif(record: dict, path: str) -> dict:
    """One result per lint finding (violation, capability or design) of every template in a lint record
    (`chatgold lint --json`'s shape, with each finding's `class` and `line`)."""
    rules: list = []
    index: dict = {}
    results = []
    for template in record["templates"]:
        for finding in template.get("findings", []):
            level = LINT_LEVELS[finding["class"]]
            rule_id = f"{finding['property']}/{finding['kind']}"
            rule = _rule_index(rules, index, rule_id, f"{finding['property']}: {finding['kind']}",
                               finding["explanation"][0], level)
            text = (f"[{finding['class']}] {' '.join(finding['explanation'])} Minimal case: {finding['case']} "
                    f"({finding['count']} case(s)).")
            if finding.get("inputs"):
                text += f" Inputs: {finding['inputs']}."
            text += _where(path, finding.get("line"), template["name"])
            results.append({"ruleId": rule_id, "ruleIndex": rule, "level": level, "message": {"text": text},
                            "locations": [_location(path, finding.get("line"))],
                            "partialFingerprints": {"chatgold/v1": f"{template['name']}|{rule_id}"}})
    return _log(rules, results, _version())


def compat_sarif(record: dict, path: str) -> dict:
    """One result per (engine, known cause) and per (engine, outcome) of the differences no cause explains, on
    the template line of the cause's construct (or the line a refusal names). What was not checked is said too,
    so silence is not read as a pass: a warning (and a run notification) per engine the run did not start (the
    record's `not_run`), a note per engine with cases it did not run (its `not-run` count)."""
    rules: list = []
    index: dict = {}
    results = []
    notifications = []
    for template in record["templates"]:
        name = template["template"]["name"]
        for skipped in template.get("not_run", []):
            spec = skipped["engine"]
            rule_id = f"compat/{spec}/engine-not-run"
            rule = _rule_index(rules, index, rule_id, f"{spec}: not run",
                               f"{spec} was not run on the template, so nothing is known of how it renders it.",
                               "warning")
            text = (f"{spec} was not run, so it is not known whether it renders {name} right: {skipped['why']}. "
                    f"The template is not said to render right everywhere.")
            results.append({"ruleId": rule_id, "ruleIndex": rule, "level": "warning", "message": {"text": text},
                            "locations": [_location(path, None)],
                            "partialFingerprints": {"chatgold/v1": f"{name}|{rule_id}"}})
            notifications.append({"level": "warning", "message": {"text": text},
                                  "associatedRule": {"id": rule_id, "index": rule}})
        for engine in template["engines"]:
            missing = [f["case"] for f in engine["failures"] if f["bucket"] == "not-run"]
            if not engine["counts"].get("not-run"):
                continue
            spec = engine["engine"]
            rule_id = f"compat/{spec}/cases-not-run"
            rule = _rule_index(rules, index, rule_id, f"{spec}: cases not run",
                               f"Cases {spec} did not run (the runner cannot express them, or the reference gave "
                               f"no answer): how it renders them is not known.", "note")
            text = (f"{spec} {engine['version']} did not run {engine['counts']['not-run']} of {engine['cases']} "
                    f"case(s) of {name}; they are neither right nor wrong"
                    + (f": {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else "") if missing else "")
                    + ".")
            results.append({"ruleId": rule_id, "ruleIndex": rule, "level": "note", "message": {"text": text},
                            "locations": [_location(path, None)],
                            "partialFingerprints": {"chatgold/v1": f"{name}|{rule_id}"}})
        for engine in template["engines"]:
            if engine["renders_right"]:
                continue
            spec = engine["engine"]
            for cause in engine["causes"]:
                rule_id = f"compat/{spec}/{cause['id']}"
                rule = _rule_index(rules, index, rule_id, f"{spec}: {cause['title'] or cause['id']}",
                                   cause.get("reason") or cause["title"] or cause["id"], "error")
                text = (f"{spec} {engine['version']} does not render {len(cause['cases'])} case(s) as the reference "
                        f"does: {cause['title'] or cause['id']} ({cause['id']}, "
                        f"{'known' if cause['known'] else 'new'}). Cases: {', '.join(cause['cases'][:10])}"
                        + (" ..." if len(cause["cases"]) > 10 else "") + ".")
                if cause.get("reason"):
                    text += f" Why: {cause['reason']}"
                text += _where(path, cause.get("line"), name)
                results.append({"ruleId": rule_id, "ruleIndex": rule, "level": "error", "message": {"text": text},
                                "locations": [_location(path, cause.get("line"))],
                                "partialFingerprints": {"chatgold/v1": f"{name}|{rule_id}"}})
            loose: dict = {}
            for failure in engine["failures"]:
                if failure.get("cause") or failure["bucket"] == "not-run":
                    continue
                loose.setdefault((failure["bucket"], failure.get("line")), []).append(failure)
            for (bucket, line), failures in sorted(loose.items(), key=lambda i: (i[0][0], i[0][1] or 0)):
                rule_id = f"compat/{spec}/{bucket}"
                rule = _rule_index(rules, index, rule_id, f"{spec}: {bucket}, no known cause",
                                   f"{spec} {bucket.replace('-', ' ')} on cases the reference renders or refuses "
                                   f"otherwise; its baseline knows no cause for them.", "error")
                first = failures[0]
                text = (f"{spec} {engine['version']}: {bucket.replace('-', ' ')} on {len(failures)} case(s) without a "
                        f"known cause: {', '.join(f['case'] for f in failures[:10])}"
                        + (" ..." if len(failures) > 10 else "") + "."
                        + (f" First message: {' '.join(first['message'].split())[:300]}" if first.get("message") else ""))
                text += _where(path, line, name)
                results.append({"ruleId": rule_id, "ruleIndex": rule, "level": "error", "message": {"text": text},
                                "locations": [_location(path, line)],
                                "partialFingerprints": {"chatgold/v1": f"{name}|{rule_id}|{line or 0}"}})
    return _log(rules, results, _version(), notifications)
