"""chatgold's own chat-template evaluator: jinja2 + the standard library, byte-identical to transformers
5.24.0 `apply_chat_template(tokenize=False)`, bounded in time and output size, with a construct inventory
and byte provenance. See README.md in this directory."""
from .errors import (EvaluatorError, InputError, LimitExceeded, OutputLimitError, RenderTimeout,
                     ReservedVariableError, SecurityViolation, TemplateCompileError, TemplateRefusal,
                     TemplateRenderError)
from .template import BUILTIN_CHATML, ChatTemplate, TracedRender, render


def inventory(template_src: str):
    from .inventory import inventory as _inventory
    return _inventory(template_src)


def origin_at(spans, byte_offset: int):
    from .tracing import origin_at as _origin_at
    return _origin_at(spans, byte_offset)


__all__ = ["BUILTIN_CHATML", "ChatTemplate", "EvaluatorError", "InputError", "LimitExceeded", "OutputLimitError",
           "RenderTimeout", "ReservedVariableError", "SecurityViolation", "TemplateCompileError", "TemplateRefusal",
           "TemplateRenderError", "TracedRender", "inventory", "origin_at", "render"]
