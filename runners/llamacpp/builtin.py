"""Which of llama.cpp's built-in (non-Jinja) chat formats a template gets: a port of its detection rules.

Without `--jinja` (and in every binding that calls the C API `llama_chat_apply_template`), llama.cpp never
runs a template: it guesses a format family from substrings of the template text and writes that family's
hard-coded format. The guess is `llm_chat_detect_template` (llama.cpp b11434, src/llama-chat.cpp:89-240),
applied to the template as llama-server holds it (normalised, see `server_source`). The server reports the
family nowhere (not in /props, not in its log), so this port says it; the llamacpp-builtin runner checks
the port against the server on every template it renders (runner.py: `BuiltinFormatCheck`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SOURCE = "llama.cpp b11434 src/llama-chat.cpp"

# The names `--chat-template NAME` accepts (LLM_CHAT_TEMPLATES, src/llama-chat.cpp:28-83). The DOTS1 family
# has no name: only detection reaches it.
BUILTIN_NAMES = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch",
    "gemma", "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr",
    "command-r", "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe",
    "rwkv-world", "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing",
    "bailing-think", "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl",
    "kimi-k2", "seed_oss", "grok-2", "pangu-embedded", "solar-open",
)
DOTS1 = "dots1"  # LLM_CHAT_TEMPLATE_DOTS1: reached by detection only (no `--chat-template` name)

# common/chat.cpp:715-721: what llama-server uses when the model has no template (or the text "chatml").
CHATML_TEMPLATE_SRC = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)

# common/chat.cpp:788-809: two load-time string patches (GPT-OSS, Mistral [TOOL_CALLS]).
_PATCHES = (
    (("<|channel|>", "in message.content or"),
     "{%- if \"<|channel|>analysis<|message|>\" in message.content or "
     "\"<|channel|>final<|message|>\" in message.content %}"),
    (("[TOOL_CALLS]", "if (message['content'] is none or"),
     "{%- if (message['content'] is none or message['content'] == '' or "
     "message['content']|length == 0) and (message['tool_calls'] is not defined or "
     "message['tool_calls'] is none or message['tool_calls']|length == 0) %}"),
)


def server_source(template: str) -> str:
    """The template text llama-server hands to `llama_chat_apply_template`.

    common_chat_templates_init (common/chat.cpp:756-845): no template or the text "chatml" becomes the
    built-in ChatML source; then the two string patches; then common_chat_template keeps the lexer's copy
    (common/chat.h:58-64), in which CRLF and CR are LF and one trailing newline of the original is dropped
    (common/jinja/lexer.cpp:43-58)."""
    source = CHATML_TEMPLATE_SRC if template in ("", "chatml") else template
    for (needle, trigger), replaced in _PATCHES:
        if needle in source and trigger in source:
            source = source.replace(replaced, "{%- if false %}")
    if not source:
        return source
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    return text[:-1] if source.endswith("\n") else text


@dataclass(frozen=True)
class Detection:
    """llama.cpp's built-in format for a template: `name` (None: not recognised) and the rule that chose it."""

    name: Optional[str]
    rule: str

    @property
    def recognised(self) -> bool:
        return self.name is not None

    @property
    def forceable(self) -> bool:
        """Whether `--chat-template <name>` selects the same family (DOTS1 has no name)."""
        return self.name in BUILTIN_NAMES

    def to_dict(self) -> dict:
        return {"builtin_format": self.name, "rule": self.rule}


def _all(text: str, *needles: str) -> bool:
    return all(needle in text for needle in needles)


def detect(template: str) -> Detection:
    """The family llama.cpp b11434 detects for a template as stored in a GGUF (see `detect_source`)."""
    return detect_source(server_source(template))


def detect_source(tmpl: str) -> Detection:
    """`llm_chat_detect_template` (src/llama-chat.cpp:89-240) on the server's normalised source: an exact
    name first, then substring rules in order; the first that holds wins."""
    if tmpl in BUILTIN_NAMES:  # :90-94, llm_chat_template_from_str
        return Detection(tmpl, "the text is the format's name")
    if "<|im_start|>" in tmpl:  # :99-104
        if "<|im_sep|>" in tmpl:
            return Detection("phi4", "contains '<|im_start|>' and '<|im_sep|>'")
        if "<end_of_utterance>" in tmpl:
            return Detection("smolvlm", "contains '<|im_start|>' and '<end_of_utterance>'")
        return Detection("chatml", "contains '<|im_start|>'")
    if tmpl.startswith("mistral") or "[INST]" in tmpl:  # :105-139
        why = "starts with 'mistral'" if tmpl.startswith("mistral") else "contains '[INST]'"
        if "[SYSTEM_PROMPT]" in tmpl:
            return Detection("mistral-v7", f"{why} and '[SYSTEM_PROMPT]'")
        if "' [INST] ' + system_message" in tmpl or "[AVAILABLE_TOOLS]" in tmpl:
            if " [INST]" in tmpl:
                return Detection("mistral-v1", f"{why}, a Mistral v1/v3 marker and ' [INST]'")
            if '"[INST]"' in tmpl:
                return Detection("mistral-v3-tekken", f"{why}, a Mistral v1/v3 marker and '\"[INST]\"'")
            return Detection("mistral-v3", f"{why} and a Mistral v1/v3 marker")
        if "content.strip()" in tmpl:
            return Detection("llama2-sys-strip", f"{why} and 'content.strip()'")
        if "bos_token + '[INST]" in tmpl:
            return Detection("llama2-sys-bos", f"{why} and \"bos_token + '[INST]\"")
        if "<<SYS>>" in tmpl:
            return Detection("llama2-sys", f"{why} and '<<SYS>>'")
        return Detection("llama2", why)
    # :140-238: one family per rule, in this order.
    for name, needles, refine in _RULES:
        if _all(tmpl, *needles):
            rule = "contains " + " and ".join(repr(needle) for needle in needles)
            if refine is not None:
                name, why = refine(tmpl)
                rule += why
            return Detection(name, rule)
    return Detection(None, "no rule of llm_chat_detect_template matches")


def _exaone_moe_or_falcon(tmpl: str) -> tuple:
    if "<|tool_declare|>" in tmpl:
        return "exaone-moe", " and <|tool_declare|>"
    return ("falcon3", " and </s>") if "</s>" in tmpl else ("glmedge", ", not </s>")


def _exaone(tmpl: str) -> tuple:
    return ("exaone4", " and [|tool|]") if "[|tool|]" in tmpl else ("exaone3", ", not [|tool|]")


def _vicuna(tmpl: str) -> tuple:
    return ("vicuna-orca", " and 'SYSTEM: '") if "SYSTEM: " in tmpl else ("vicuna", ", not 'SYSTEM: '")


def _granite(tmpl: str) -> tuple:
    if "<tool_call>" in tmpl or "<tools>" in tmpl:
        if "g4_default_system_message" in tmpl:
            return "granite-4.0", ", <tool_call> or <tools>, and g4_default_system_message"
        return "granite-4.1", ", <tool_call> or <tools>, not g4_default_system_message"
    return "granite", ", neither <tool_call> nor <tools>"


# (family, substrings that must all occur, refinement) in the order of src/llama-chat.cpp:140-238.
_RULES = (
    ("phi3", ("<|assistant|>", "<|end|>"), None),
    ("chatglm4", ("[gMASK]<sop>",), None),
    ("glmedge", ("<|assistant|>", "<|user|>"), _exaone_moe_or_falcon),
    ("glmedge", ("<|{{ item['role'] }}|>", "<|begin_of_image|>"), None),
    ("zephyr", ("<|user|>", "<|endoftext|>"), None),
    ("monarch", ("bos_token + message['role']",), None),
    ("gemma", ("<start_of_turn>",), None),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",), None),
    ("openchat", ("GPT4 Correct ",), None),
    ("vicuna", ("USER: ", "ASSISTANT: "), _vicuna),
    ("deepseek", ("### Instruction:", "<|EOT|>"), None),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), None),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>"), None),
    ("chatglm3", ("[gMASK]sop",), None),
    ("minicpm", ("<用户>",), None),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",), None),
    ("deepseek3", ("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), None),
    ("exaone3", ("[|system|]", "[|assistant|]", "[|endofturn|]"), _exaone),
    ("rwkv-world", ("rwkv-world",), None),
    ("rwkv-world", ("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",), None),
    ("granite", ("<|start_of_role|>",), _granite),
    ("gigachat", ("message['role'] + additional_special_tokens[0] + message['content'] + "
                  "additional_special_tokens[1]",), None),
    ("megrez", ("<|role_start|>",), None),
    ("yandex", (" Ассистент:",), None),
    ("bailing", ("<role>ASSISTANT</role>", "'HUMAN'"), None),
    ("bailing-think", ("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), None),
    ("bailing2", ("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), None),
    ("llama4", ("<|header_start|>", "<|header_end|>"), None),
    (DOTS1, ("<|endofuserprompt|>",), None),
    ("hunyuan-moe", ("<|extra_0|>", "<|extra_4|>"), None),
    ("gpt-oss", ("<|start|>", "<|channel|>"), None),
    ("hunyuan-vl", ("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), None),
    ("hunyuan-dense", ("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), None),
    ("kimi-k2", ("<|im_assistant|>assistant<|im_middle|>",), None),
    ("seed_oss", ("<seed:bos>",), None),
    ("grok-2", ("'Assistant: '  + message['content'] + '<|separator|>",), None),
    ("pangu-embedded", ("[unused9]系统：[unused10]",), None),
    ("solar-open", ("<|begin|>", "<|end|>", "<|content|>"), None),
)
