"""Example harness: a hand-written ChatML renderer (seed 001, kopitiam-ai's render_chatml).

It never reads the template: one `<|im_start|>{role}\\n{content}<|im_end|>\\n` block per message, then an
unconditional `<|im_start|>assistant\\n` (add_generation_prompt is not optional there). Its messages are
{role: system|user|assistant, content: string}; anything else cannot be expressed and is refused.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runners.base import Raised, RefusalKind, Rendered, Skipped  # noqa: E402
from runners.harness import serve  # noqa: E402
from runners.identity import harness_build  # noqa: E402

ROLES = ("system", "user", "assistant")


def render(request):
    if request.tools or request.documents:
        return Skipped("kopitiam-ai's ChatML renderer has no tools or documents")
    if request.continue_final_message:
        return Skipped("kopitiam-ai's ChatML renderer cannot continue a final message")
    prompt = []
    for message in request.messages:
        role, content = message.get("role"), message.get("content")
        # Its Message type is {Role, String}: other roles or structured content do not exist there.
        if role not in ROLES:
            return Raised(f"kopitiam-ai has no role {role!r} (system, user, assistant)", RefusalKind.RENDER)
        if not isinstance(content, str):
            return Raised(f"kopitiam-ai message content is a string, got {type(content).__name__}", RefusalKind.RENDER)
        prompt.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    prompt.append("<|im_start|>assistant\n")
    return Rendered("".join(prompt))


if __name__ == "__main__":
    serve({"name": "chatml-builtin", "version": "kopitiam-ai 0.2.5", "language": "rust",
           "homepage": "seed 001: kopitiam-ai render_chatml"}, render, build=harness_build(__file__))
