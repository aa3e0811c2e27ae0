"""The evaluator's typed errors.

Every failure is an EvaluatorError. Each one carries the exception type name and message the reference
(transformers 5.24.0 `apply_chat_template`) reports for the same input, so a runner can produce a refusal
message identical to the HF runner's `"<ExceptionType>: <message>"`, while `str(error)` stays readable.

    EvaluatorError
    ├── TemplateCompileError     the template does not compile (syntax, unknown filter/test); has .lineno
    ├── TemplateRenderError      a construct failed while rendering; has .lineno, .constructs, .source_line
    │   └── TemplateRefusal      the template called raise_exception(...); .template_message is its text
    ├── InputError               the request itself is refused before rendering (empty conversation,
    │   └── ReservedVariableError  non-dict messages, continue_final_message problems, kwargs naming a
    │                               reserved variable such as messages/tools/documents/add_generation_prompt)
    ├── SecurityViolation        the sandbox refused an unsafe attribute, call or namespace write
    └── LimitExceeded            a bound was hit (never a reference outcome: the runner reports Errored)
        ├── RenderTimeout        the time limit (rendering, or compiling the template)
        ├── OutputLimitError     the output-size, value-size or item limit
        └── TemplateTooLarge     the template is over runners.base.MAX_TEMPLATE_BYTES
"""
from __future__ import annotations

from typing import Optional, Sequence


class EvaluatorError(Exception):
    """Base of every evaluator failure. `reference` is what HF would raise: (type name, message)."""

    def __init__(self, message: str, *, reference_type: Optional[str] = None,
                 reference_message: Optional[str] = None):
        super().__init__(message)
        self.reference_type = reference_type or type(self).__name__
        self.reference_message = message if reference_message is None else reference_message

    def reference_text(self) -> str:
        """`"<ExceptionType>: <message>"` exactly as the HF runner formats the same failure."""
        return f"{self.reference_type}: {self.reference_message}"


class TemplateCompileError(EvaluatorError):
    def __init__(self, message: str, lineno: Optional[int], **kw):
        where = f"line {lineno}: " if lineno else ""
        super().__init__(f"template does not compile: {where}{message}", **kw)
        self.lineno = lineno


class TemplateRenderError(EvaluatorError):
    def __init__(self, message: str, lineno: Optional[int] = None, constructs: Sequence[str] = (),
                 source_line: str = "", **kw):
        where = ""
        if lineno:
            where = f" at template line {lineno}"
            if constructs:
                where += f" ({', '.join(constructs)})"
            if source_line:
                where += f": {source_line.strip()[:160]!r}"
        super().__init__(f"{message}{where}", **kw)
        self.lineno = lineno
        self.constructs = tuple(constructs)
        self.source_line = source_line


class TemplateRefusal(TemplateRenderError):
    """raise_exception(...) was called: the template refuses this conversation on purpose."""

    def __init__(self, template_message: str, lineno: Optional[int] = None, **kw):
        super().__init__(f"template refused: {template_message}", lineno, ("global:raise_exception",),
                         reference_type="TemplateError", reference_message=template_message, **kw)
        self.template_message = template_message


class InputError(EvaluatorError):
    """The request is refused before the template runs (HF refuses it the same way)."""


class ReservedVariableError(InputError):
    """kwargs tried to set a variable the evaluator binds itself (messages, tools, ...)."""


class SecurityViolation(EvaluatorError):
    """The sandbox refused an unsafe operation (HF raises jinja2's SecurityError)."""


class LimitExceeded(EvaluatorError):
    """A resource bound was hit. Not a template outcome: the reference would hang or exhaust memory."""


class RenderTimeout(LimitExceeded):
    pass


class OutputLimitError(LimitExceeded):
    pass


class TemplateTooLarge(LimitExceeded):
    pass
