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
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

MODEL_FORMAT = 1  # bump when the file layout changes, so that cached files are rebuilt
N_EMBD = 16
N_HEAD = 2
N_FF = 32
N_CTX_TRAIN = 4096
SEED = 20250615

UNK_TEXT = "<unk>"
NO_BOS_TEXT = "<chatgold-no-bos>"
NO_EOS_TEXT = "<chatgold-no-eos>"


def model_key(template: str, bos_token: Optional[str], eos_token: Optional[str]) -> str:
    digest = hashlib.sha256()
    for part in (str(MODEL_FORMAT), template, repr(bos_token), repr(eos_token)):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]


def _vocabulary(bos_token: Optional[str], eos_token: Optional[str]):
    """Tokens, token types, bos id, eos id. SPM-style: <unk>, specials, the 256 byte tokens, one space."""
    import gguf

    tokens: list[str] = [UNK_TEXT]
    types: list[int] = [gguf.TokenType.UNKNOWN]
    index: dict[str, int] = {UNK_TEXT: 0}

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


def write_model(path: Path, template: str, bos_token: Optional[str], eos_token: Optional[str]) -> None:
    import gguf

    tokens, types, bos_id, eos_id = _vocabulary(bos_token, eos_token)
    n_vocab = len(tokens)
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
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(eos_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
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


def model_for(template: str, bos_token: Optional[str], eos_token: Optional[str], directory: Path) -> Path:
    """The cached GGUF for this (template, bos, eos), written atomically when missing."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{model_key(template, bos_token, eos_token)}.gguf"
    if target.is_file():
        return target
    handle, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=directory)
    os.close(handle)
    try:
        write_model(Path(temp), template, bos_token, eos_token)
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return target
