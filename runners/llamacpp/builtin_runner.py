"""LlamaCppBuiltinRunner (`llamacpp-builtin`): the same real llama-server, started with `--no-jinja`.

Without Jinja, llama-server renders a chat through `llama_chat_apply_template` (common/chat.cpp:1375-1438 →
src/llama.cpp:510-539): it guesses a built-in format from the template text and writes that format's
hard-coded prompt from each message's role and content. This is also what bindings calling the C API get.
Each cell is one POST /apply-template, the path /v1/chat/completions takes in this mode.

Refusals of the whole template or request are of kind `unsupported` (they never match a reference refusal):
- a template no rule recognises: every request fails with "this custom template is not supported, try using
  --jinja" (common/chat.cpp:1412-1416);
- a request with tools: "tools param requires --jinja flag" (tools/server/server-common.cpp:1277-1284).

Per template the runner records the built-in format the port of llama.cpp's detection (builtin.py) gives, and
checks it against the server: a probe conversation rendered through the template's own server must equal the
same conversation through a server started with `--chat-template <format>` (or, for a template the port
does not recognise, be refused as unsupported). `template_facts()` returns both.
"""
from __future__ import annotations

import threading

from ..base import Conversation, Outcome, Raised, RefusalKind, Rendered, RenderRequest
from .builtin import CHATML_TEMPLATE_SRC, SOURCE, detect
from .runner import LlamaCppRunner, refusal_kind

# The engine's refusals of a whole template or request (messages as llama.cpp b11434 writes them).
UNSUPPORTED_MESSAGES = (
    "this custom template is not supported, try using --jinja",
    "tools param requires --jinja flag",
    "tool_choice param requires --jinja flag",
)
NOT_RECOGNISED = UNSUPPORTED_MESSAGES[0]

# The conversation of llama.cpp's own tests of the built-in formats (tests/test-chat-template.cpp:355-362):
# a system message, two turns and padded assistant content tell most formats apart.
PROBE = Conversation(messages=[
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
], add_generation_prompt=True)


class LlamaCppBuiltinRunner(LlamaCppRunner):
    name = "llamacpp-builtin"
    cost_hint = 4.0   # the same round trip as llamacpp, without its per-request Jinja analysis
    jinja = False
    uses_clock = False  # built-in formats write no date; the template's own clock calls never run

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._facts: dict = {}
        self._facts_lock = threading.Lock()

    @classmethod
    def refusal_kind(cls, message: str, at_start: bool = False) -> RefusalKind:
        if any(text in message for text in UNSUPPORTED_MESSAGES):
            return RefusalKind.UNSUPPORTED
        return refusal_kind(message, at_start)

    def reports_capabilities(self) -> bool:
        # /props reports its Jinja probes' capabilities even with --no-jinja: not what the built-in formats do.
        return False

    def describe(self) -> dict:
        info = super().describe()
        info["mode"] = ("llama-server --no-jinja: llama_chat_apply_template's built-in formats; format "
                        f"detection ported from {SOURCE}")
        return info

    def template_facts(self) -> dict:
        with self._facts_lock:
            return dict(self._facts)

    def _group_done(self, key: tuple, item) -> None:
        if key[3] is not None or not isinstance(item, RenderRequest) or not item.template_id:
            return  # token-parity groups and unlabelled requests get no fact
        facts = self.builtin_format(item.template, item.bos_token, item.eos_token)
        with self._facts_lock:
            self._facts[item.template_id] = facts

    def builtin_format(self, template: str, bos_token=None, eos_token=None) -> dict:
        """{"builtin_format": name or None, "rule": why, "server_check": agrees | disagrees: ... | not checked: ...}"""
        detection = detect(template)
        facts = detection.to_dict()
        probe = RenderRequest(template, PROBE, bos_token, eos_token, template_id="<format probe>")
        own = self._render_uncached(probe)
        if isinstance(own, Raised) and own.refusal == RefusalKind.COMPILE:
            facts["server_check"] = f"not checked: the server does not start on this template ({own.message})"
            return facts
        if not isinstance(own, (Rendered, Raised)):
            facts["server_check"] = f"not checked: {own.message}"
            return facts
        refused = isinstance(own, Raised) and NOT_RECOGNISED in own.message
        if not detection.recognised:
            facts["server_check"] = "agrees" if refused else f"disagrees: the server renders it ({_show(own)})"
        elif refused:
            facts["server_check"] = "disagrees: the server does not recognise it"
        elif not detection.forceable:
            facts["server_check"] = ("agrees" if isinstance(own, Rendered) else
                                     f"disagrees: the server refuses the probe ({_show(own)})")
        else:
            forced = self._render_uncached(RenderRequest(CHATML_TEMPLATE_SRC, PROBE, template_id="<forced format>"),
                                           variant=("force", detection.name))
            facts["server_check"] = ("agrees" if forced == own else
                                     f"disagrees: --chat-template {detection.name} gives {_show(forced)}, the "
                                     f"template {_show(own)}")
        return facts


def _show(outcome: Outcome) -> str:
    text = outcome.text if isinstance(outcome, Rendered) else getattr(outcome, "message", "")
    return repr(text[:120])
