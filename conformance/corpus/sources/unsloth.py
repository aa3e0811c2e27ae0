"""Unsloth 2026.10.9: the templates `get_chat_template(tokenizer, name)` installs, read from its source.

`unsloth/chat_templates.py` builds each template as a module-level string (implicit concatenation, `+` and
references to earlier templates) and registers it in `CHAT_TEMPLATES[name] = (template, eos, ...)`. We fold
those expressions with `ast` — the package is never imported or executed. Like `get_chat_template`, a
template holding the `{system_message}` placeholder gets `DEFAULT_SYSTEM_MESSAGE[name]` filled in (escaped
for a Jinja string literal), because those filled bytes are what Unsloth writes into a tokenizer.
Unsloth Studio also ships two `.jinja` files.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

from conformance.corpus.sources import Candidate, PackageSource, SourceError
from conformance.corpus.sources._wheel import (
    GENERIC_FORMAT_NAMES,
    package_dir,
    wheel_license,
)

SOURCE_ID = "unsloth"
MODULE = "unsloth/chat_templates.py"
STUDIO_DIR = "studio/backend/assets/chat_templates"
PLACEHOLDER = "{system_message}"


class _Unfoldable(Exception):
    pass


def _fold(node: ast.expr, strings: dict[str, str]) -> str:
    """Evaluate a string expression made of literals, `+` and names bound to strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _fold(node.left, strings) + _fold(node.right, strings)
    if isinstance(node, ast.Name) and node.id in strings:
        return strings[node.id]
    raise _Unfoldable(ast.dump(node)[:80])


def _subscript_key(target: ast.expr, mapping: str) -> Optional[str]:
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == mapping \
            and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
        return target.slice.value
    return None


def escape_jinja_literal(text: str) -> str:
    # Same escaping Unsloth applies before splicing a system message into a Jinja '...' literal.
    return text.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"').replace("\r", "\\r")


def registered_templates(source_text: str, file_label: str) -> list[dict]:
    """[{key, variable, template, eos, system_message}] in registration order, statically folded."""
    try:
        tree = ast.parse(source_text, filename=file_label)
    except SyntaxError as exc:
        raise SourceError(f"{file_label}: cannot parse: {exc}") from exc
    strings: dict[str, str] = {}
    origin_of: dict[str, str] = {}  # variable -> the variable its string was first defined in
    registered: list[dict] = []
    system_messages: dict[str, Optional[str]] = {}
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            try:
                strings[target.id] = _fold(stmt.value, strings)
            except _Unfoldable:
                strings.pop(target.id, None)
                continue
            value = stmt.value
            origin_of[target.id] = origin_of.get(value.id, value.id) if isinstance(value, ast.Name) else target.id
            continue
        key = _subscript_key(target, "CHAT_TEMPLATES")
        if key is not None and isinstance(stmt.value, ast.Tuple) and stmt.value.elts:
            first = stmt.value.elts[0]
            try:
                template = _fold(first, strings)
            except _Unfoldable:
                continue
            variable = origin_of.get(first.id, first.id) if isinstance(first, ast.Name) else None
            eos_node = stmt.value.elts[1] if len(stmt.value.elts) > 1 else None
            eos = None
            if isinstance(eos_node, ast.Constant) and isinstance(eos_node.value, str):
                eos = eos_node.value
            elif isinstance(eos_node, ast.Name) and eos_node.id in strings:
                eos = strings[eos_node.id]
            registered.append({"key": key, "variable": variable, "template": template, "eos": eos})
            continue
        key = _subscript_key(target, "DEFAULT_SYSTEM_MESSAGE")
        if key is not None:
            try:
                system_messages[key] = _fold(stmt.value, strings)
            except _Unfoldable:
                system_messages[key] = None  # None, or nothing we can fold: no default to fill in
    for entry in registered:
        entry["system_message"] = system_messages.get(entry["key"])
    return registered


def extract(root: Path) -> Iterator[Candidate]:
    license_id = wheel_license(root)
    module = package_dir(root, MODULE)
    by_text: dict[str, list[dict]] = {}
    for entry in registered_templates(module.read_text(encoding="utf-8"), str(module)):
        text = entry["template"]
        if "{%" not in text and "{{" not in text:
            continue
        if entry["system_message"] is not None and PLACEHOLDER in text:
            text = text.replace(PLACEHOLDER, escape_jinja_literal(entry["system_message"]))
        by_text.setdefault(text, []).append(entry)
    for text, entries in by_text.items():
        first = entries[0]
        keys = [e["key"] for e in entries]
        # "eos_token" means: keep the tokenizer's own EOS; anything else is the EOS Unsloth maps to.
        eos = first["eos"] if first["eos"] not in (None, "eos_token") else None
        yield Candidate(
            text=text.encode("utf-8"), source=SOURCE_ID, path=f"{MODULE}:{first['variable'] or first['key']}",
            name=f"unsloth-{first['key']}", license=license_id,
            generic=any(k.replace("-", "_") in GENERIC_FORMAT_NAMES for k in keys),
            # Unsloth's EOS mapping is kept as data, not as the template's EOS: it states no BOS, and the
            # corpus takes both tokens from one place (else the family table).
            extra={"chat_template_names": keys, **({"unsloth_eos_token": eos} if eos else {}),
                   **({"filled_system_message": first["system_message"]}
                      if first["system_message"] is not None and PLACEHOLDER in first["template"] else {})},
        )
    for path in sorted(package_dir(root, STUDIO_DIR).glob("*.jinja")):
        yield Candidate(
            text=path.read_bytes(), source=SOURCE_ID, path=f"{STUDIO_DIR}/{path.name}",
            name=f"unsloth-studio-{path.stem}", license=license_id,
        )


SOURCE = PackageSource(
    id=SOURCE_ID, package="unsloth", version="2026.10.9", dist="wheel",
    sha256="feb40b99bc4f8c543a36cbd0fe6e1410d6e4ac16bd4d0c731f607adce3d63bb0", extract=extract,
)
