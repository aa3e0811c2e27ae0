"""Tiny vocabularies for token-level comparisons: the chat markers a template writes, the byte-level alphabet.

The chat markers (`<|im_start|>`, `[INST]`, `<start_of_turn>`...) are texts a real model's vocabulary holds
as single special tokens.

Token-level comparisons need every special token to be one id on both sides, so that a doubled BOS or a
marker split differently is visible. The corpus records no tokenizer vocabularies, only bos/eos, so the
markers are read from the template itself: marker-shaped substrings of the text it prints (literal text
outside tags and string literals inside them). A marker the template assembles at render time
(`'<|' + role + '|>'`) is not found; it is then text on both sides of a comparison, never one side only.
"""
from __future__ import annotations

import re
from typing import Optional

MAX_MARKERS = 256

_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
_MARKER = re.compile(
    r"<\|[^\s<>|]{1,64}\|>"                  # <|im_start|>, <|eot_id|>
    r"|<｜[^\s<>｜]{1,64}｜>"                  # <｜User｜> (full-width bars)
    r"|</?[A-Za-z_][A-Za-z0-9_:.\-]{0,63}>"  # <s>, </s>, <start_of_turn>, <seed:bos>
    r"|\[/?[A-Z][A-Z0-9_]{1,63}\]"           # [INST], [/INST], [TOOL_CALLS]
    r"|\[\|[A-Za-z_]{1,32}\|\]"              # [|system|]
    r"|\[gMASK\]"
)


def _printed_texts(template: str) -> list:
    """The template's literal text outside tags, and the string literals inside its tags (comments skipped)."""
    texts, position = [], 0
    for tag in _TAG.finditer(template):
        texts.append(template[position:tag.start()])
        if not tag.group().startswith("{#"):
            texts.extend(match.group()[1:-1] for match in _STRING.finditer(tag.group()))
        position = tag.end()
    texts.append(template[position:])
    return texts


def template_markers(template: str, bos_token: Optional[str] = None, eos_token: Optional[str] = None) -> tuple:
    """Marker texts of the template in first-seen order, without the bos/eos texts (callers add those)."""
    seen: dict = {}
    for text in _printed_texts(template):
        for match in _MARKER.finditer(text):
            marker = match.group()
            if marker not in (bos_token, eos_token) and not marker.startswith("<0x"):
                seen.setdefault(marker, None)
            if len(seen) >= MAX_MARKERS:
                return tuple(seen)
    return tuple(seen)


def byte_level_alphabet() -> list:
    """GPT-2's byte-level alphabet (tokenizers' ByteLevel, llama.cpp's BPE): the character standing for each
    byte 0-255: printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for byte in range(256):
        if byte in printable:
            out.append(chr(byte))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out
