"""chatgold's own chat-template evaluator: jinja2 + the standard library, byte-identical to transformers
5.24.0 `apply_chat_template(tokenize=False)`, bounded in time and output size, with a construct inventory
and byte provenance. See README.md in this directory."""
from .errors import (
                     EvaluatorError,
                     InputError,
                     LimitExceeded,
                     OutputLimitError,
                     RenderTimeout,
                     ReservedVariableError,
                     SecurityViolation,
                     TemplateCompileError,
                     TemplateRefusal,
                     TemplateRenderError,
)

# Imported eagerly: a lazy wrapper named `inventory` would be replaced by the submodule of that name
# as soon as anything imported runners.evaluator.inventory.
from .inventory import inventory
from .template import BUILTIN_CHATML, ChatTemplate, TracedRender, render
from .tracing import origin_at

__all__ = ["BUILTIN_CHATML", "ChatTemplate", "EvaluatorError", "InputError", "LimitExceeded", "OutputLimitError",
           "RenderTimeout", "ReservedVariableError", "SecurityViolation", "TemplateCompileError", "TemplateRefusal",
           "TemplateRenderError", "TracedRender", "inventory", "origin_at", "render"]
