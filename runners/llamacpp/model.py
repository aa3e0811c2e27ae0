"""Tiny real GGUF models that carry one chat template, for llama-server to load.

Each file is a valid 1-layer llama model with seeded random weights (a few tens of KB) whose vocabulary holds
the template's BOS/EOS texts as control tokens and whose `tokenizer.chat_template` is the template. llama.cpp
reads everything it passes to the template from the file, exactly as it would for a real model.

BOS/EOS mapping, chosen to get as close as llama.cpp allows to what the reference passes:
- `tokenizer.ggml.add_bos_token` / `add_eos_token` are false: otherwise llama.cpp strips a leading BOS / a
  trailing EOS from the rendered prompt (it expects the tokenizer to add them back), and the text would no
  longer be what the template produced.
- A missing bos/eos (None): the reference passes no such variable. llama.cpp always defines `bos_token` and
  `eos_token`; the closest it gets is an empty string, which it produces for a token of type UNUSED (its
  piece renders as nothing). An empty token text cannot be used: llama.cpp renames it `[EMPTY_<id>]`.

Token-parity variant (`TokenVocab`): what llama.cpp would *feed a model* depends on the model's own flags,
so this variant carries them: `add_bos_token`/`add_eos_token` as the model states them (an unstated
add_eos_token is left out, so llama.cpp's default for the vocabulary type applies), and a byte-level BPE
vocabulary (`gpt2`, as most chat models ship, no merges: one token per byte) in which the BOS, the EOS and
every chat marker of the template is one control token. SPM is avoided there: it conflates a literal U+2581
with a space and, by default, inserts a space token before text and after every special token.
Byte-level goldens keep using the plain file: with add_bos true llama.cpp strips the template's leading BOS
text from the rendered prompt, which is part of what the token variant shows.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..vocab import byte_level_alphabet

MODEL_FORMAT = 1  # bump when the file layout changes, so that cached files are rebuilt
N_EMBD = 16
N_HEAD = 2
N_FF = 32
N_CTX_TRAIN = 4096
SEED = 20250615

UNK_TEXT = "<unk>"
NO_BOS_TEXT = "<chatgold-no-bos>"
NO_EOS_TEXT = "<chatgold-no-eos>"


@dataclass(frozen=True)
class TokenVocab:
    """The token-parity variant of a template's GGUF: the model's add-special flags and chat markers."""

    add_bos_token: bool
    add_eos_token: Optional[bool]  # None: not stated (no key written)
    markers: tuple = ()


# llama.cpp b11434's add-bos/add-eos when a GGUF states none: per tokenizer model, and for BPE per
# pre-tokenizer (src/llama-vocab.cpp:1860-1862, 2203-2215, 2336-2341, 2363-2367, 2462-2491); then the file's
# keys, then the Gemma 4 override (:2671-2691).
_BPE_MODELS = frozenset({"gpt2", "hybriddna", "whitespace", "gemma4"})
_BPE_PRE_ADDING_BOS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                                 "lfm2", "jina-v5-nano", "tekken", "chameleon"})
_GEMMA4_PRE = frozenset({"gemma4", "granite-embed-multi-311m"})


def llama_vocab_flags(model: Optional[str], pre: Optional[str], add_bos: Optional[bool],
                      add_eos: Optional[bool]) -> tuple[bool, bool, str]:
    """(add_bos, add_eos, how they were decided) as llama.cpp loads a GGUF with these tokenizer keys."""
    default_bos = model in ("llama", "bert") or (model in _BPE_MODELS and pre in _BPE_PRE_ADDING_BOS)
    default_eos = model == "t5"
    how = []
    bos = default_bos if add_bos is None else bool(add_bos)
    eos = default_eos if add_eos is None else bool(add_eos)
    how.append("add_bos_token " + ("stated" if add_bos is not None else f"llama.cpp's default for {model!r}/{pre!r}"))
    how.append("add_eos_token " + ("stated" if add_eos is not None else f"llama.cpp's default for {model!r}"))
    if model in _BPE_MODELS and pre in _GEMMA4_PRE and not bos:
        bos = True
        how.append("add_bos forced true for Gemma 4")
    return bos, eos, "; ".join(how)


def model_key(template: str, bos_token: Optional[str], eos_token: Optional[str],
              tokens: Optional[TokenVocab] = None) -> str:
    digest = hashlib.sha256()
    parts = (str(MODEL_FORMAT), template, repr(bos_token), repr(eos_token))
    if tokens is not None:  # the plain file's key is unchanged, so cached plain files stay valid
        parts += ("tokens-bpe", repr(tokens.add_bos_token), repr(tokens.add_eos_token), *tokens.markers)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]


def _vocabulary(bos_token: Optional[str], eos_token: Optional[str], markers: tuple = (), byte_level: bool = False):
    """Tokens, token types, bos id, eos id. SPM-style: <unk>, specials, markers, the 256 byte tokens, one space;
    byte_level: specials, markers, then the 256 characters of the byte-level alphabet (no <unk>)."""
    import gguf

    tokens: list[str] = [] if byte_level else [UNK_TEXT]
    types: list[int] = [] if byte_level else [gguf.TokenType.UNKNOWN]
    index: dict[str, int] = {} if byte_level else {UNK_TEXT: 0}

    def special(text: Optional[str], placeholder: str) -> int:
        if text is None:
            text, kind = placeholder, gguf.TokenType.UNUSED
        elif text == "":
            raise ValueError("an empty bos/eos token text cannot be stored in a GGUF vocabulary")
        else:
            kind = gguf.TokenType.CONTROL
        if text in index:
            return index[text]
        index[text] = len(tokens)
        tokens.append(text)
        types.append(kind)
        return index[text]

    bos_id = special(bos_token, NO_BOS_TEXT)
    eos_id = special(eos_token, NO_EOS_TEXT)
    for marker in markers:
        special(marker, marker)
    if byte_level:
        for char in byte_level_alphabet():
            if char not in index:  # a one-character special token text shadows the byte's own token
                index[char] = len(tokens)
                tokens.append(char)
                types.append(gguf.TokenType.NORMAL)
        return tokens, types, bos_id, eos_id
    for byte in range(256):  # SPM needs byte tokens (llama.cpp looks up <0x0A> for the newline token)
        text = f"<0x{byte:02X}>"
        if text not in index:
            index[text] = len(tokens)
            tokens.append(text)
            types.append(gguf.TokenType.BYTE)
    if "\u2581" not in index:
        tokens.append("\u2581")
        types.append(gguf.TokenType.NORMAL)
    return tokens, types, bos_id, eos_id


def vocabulary(bos_token: Optional[str], eos_token: Optional[str], tokens: Optional[TokenVocab] = None) -> tuple:
    """(token texts, token types) of the file `write_model` writes for these arguments."""
    texts, types, _, _ = _vocabulary(bos_token, eos_token, tokens.markers if tokens else (), tokens is not None)
    return texts, types


def write_model(path: Path, template: str, bos_token: Optional[str], eos_token: Optional[str],
                tokens: Optional[TokenVocab] = None) -> None:
    import gguf

    tokens_list, types, bos_id, eos_id = _vocabulary(bos_token, eos_token, tokens.markers if tokens else (),
                                                     tokens is not None)
    n_vocab = len(tokens_list)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("chatgold-template-carrier")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tokens is None:
        writer.add_tokenizer_model("llama")
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        # llama.cpp refuses a BPE vocabulary without merges; this one can never apply (both sides are two
        # characters long, and without another merge no symbol ever is), so every byte stays one token.
        writer.add_token_merges(["ab cd"])
    writer.add_token_list(tokens_list)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(eos_id)
    if tokens is None:
        writer.add_unk_token_id(0)
    if tokens is None:
        writer.add_add_bos_token(False)
        writer.add_add_eos_token(False)
    else:
        writer.add_add_bos_token(tokens.add_bos_token)
        if tokens.add_eos_token is not None:
            writer.add_add_eos_token(tokens.add_eos_token)
    writer.add_chat_template(template)

    rng = np.random.default_rng(SEED)

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weights(n_vocab, N_EMBD))
    writer.add_tensor("blk.0.attn_norm.weight", ones)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        writer.add_tensor(f"blk.0.{name}.weight", weights(N_EMBD, N_EMBD))
    writer.add_tensor("blk.0.ffn_norm.weight", ones)
    writer.add_tensor("blk.0.ffn_gate.weight", weights(N_FF, N_EMBD))
    writer.add_tensor("blk.0.ffn_up.weight", weights(N_FF, N_EMBD))
    writer.add_tensor("blk.0.ffn_down.weight", weights(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def model_for(template: str, bos_token: Optional[str], eos_token: Optional[str], directory: Path,
              tokens: Optional[TokenVocab] = None) -> Path:
    """The cached GGUF for this (template, bos, eos[, token variant]), written atomically when missing."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{model_key(template, bos_token, eos_token, tokens)}.gguf"
    if target.is_file():
        return target
    handle, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=directory)
    os.close(handle)
    try:
        write_model(Path(temp), template, bos_token, eos_token, tokens)
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return target
