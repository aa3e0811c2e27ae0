"""The service's request and response bodies (pydantic): the schemas of /openapi.json."""
from __future__ import annotations

import json
import math
from typing import Any, Literal, Optional

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from conformance.judge.status import STATUSES
from conformance.service.limits import COMPAT_MAX_ENGINES, MAX_BATCH_CELLS, MAX_OUTPUT_CHARS, SHA256_PATTERN
from runners.base import MAX_TEMPLATE_BYTES


class JSONBody(JSONResponse):
    """JSON that survives lone surrogates (goldens keep them byte-exact): escape them instead of failing; and
    strict JSON: a NaN or an infinity (echoed from a request's number) is written as a string, never as the
    bare NaN/Infinity that strict parsers reject."""

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
        except ValueError:  # a float that is not finite
            return self.render(_finite(content))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf", "-inf": the value the request held, in strict JSON
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class ErrorBody(BaseModel):
    detail: str = Field(description="What was wrong with the request")


class TemplateSummary(BaseModel):
    id: str
    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the template's exact UTF-8 bytes")
    family: str
    variant: str
    generic: bool
    bos_token: Optional[str]
    eos_token: Optional[str]
    aliases: list[str] = Field(description="Model repositories this template ships with")
    constructs: Optional[list[str]] = Field(
        None, description="Jinja constructs the template uses; null when not requested or unavailable")
    capabilities: Optional[dict[str, Any]] = Field(
        None, description="The template's capability golden; null when none is recorded or unavailable")
    notes: list[str] = Field(default_factory=list, description="Why constructs/capabilities are missing")


class TemplateDetail(TemplateSummary):
    source: str = Field(description="The template text, exactly")


class TemplateList(BaseModel):
    count: int
    templates: list[TemplateSummary]


class CaseInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    description: str
    features: list[str]
    messages: list[Any]
    add_generation_prompt: bool
    continue_final_message: bool
    kwargs: dict[str, Any]
    now: str
    tools: Optional[list[Any]] = None
    documents: Optional[list[Any]] = None
    sequence: Optional[dict[str, Any]] = None


class CaseList(BaseModel):
    count: int
    cases: list[CaseInput]


class GoldenJSON(BaseModel):
    template: str
    case: str
    kind: Literal["rendered", "raised"] = Field(
        description="rendered: `text` is the expected output; raised: the reference refused and `text` is its message")
    text: str
    bytes: int = Field(description="Length of the golden in UTF-8 bytes")


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["output"]}, {"required": ["raised"]}]})
    template: str = Field(max_length=200, description="Corpus template id")
    case: str = Field(max_length=200, description="Case id")
    output: Optional[str] = Field(None, max_length=MAX_OUTPUT_CHARS, description="What the engine rendered")
    raised: Optional[str] = Field(None, max_length=MAX_OUTPUT_CHARS,
                                  description="The engine refused to render, with this message")
    refusal: Optional[Literal["compile", "raise", "render", "unsupported"]] = Field(
        None, description="Which kind of refusal `raised` is (compile: the template does not compile; raise: it "
                          "called raise_exception; render: rendering failed; unsupported: the engine declines "
                          "the template or request as a whole, which never matches). Absent: unknown, and only a "
                          "raise_exception message can then match")

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.output is None) == (self.raised is None):
            raise ValueError("give exactly one of `output` (the engine rendered) or `raised` (the engine refused)")
        return self


class DivergenceModel(BaseModel):
    offset: int = Field(description="First differing byte offset (UTF-8) in the golden")
    expected_len: int
    actual_len: int
    expected_context: str = Field(description="The golden around the offset, whitespace made visible; ⟦ marks it")
    actual_context: str = Field(description="The output around the offset, same notation")
    line: int = Field(description="1-based line of the offset in the golden")
    column: int


class Attribution(BaseModel):
    # "construct" would shadow BaseModel.construct: keep the wire name through an alias.
    model_config = ConfigDict(populate_by_name=True)
    line: Optional[int] = Field(None, description="1-based template line that emitted the golden's byte")
    construct_name: Optional[str] = Field(None, alias="construct", description="The Jinja construct that emitted it")
    source_line: Optional[str] = None
    at_golden_end: Optional[bool] = None
    unavailable: Optional[str] = Field(None, description="Why no line could be attributed")


class CheckResult(BaseModel):
    template: str
    case: str
    status: Literal[tuple(str(s) for s in STATUSES)]  # type: ignore[valid-type]
    passed: bool
    golden_kind: Optional[Literal["rendered", "raised"]]
    divergence: Optional[DivergenceModel] = None
    reference_message: Optional[str] = Field(None, description="The reference's refusal, when it refused")
    reference_refusal: Optional[Literal["compile", "raise", "render"]] = Field(
        None, description="The kind of the reference's refusal, when it refused")
    note: Optional[str] = Field(None, description="Why two refusals do not match, when they do not")
    attribution: Optional[Attribution] = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cells: list[CheckRequest] = Field(max_length=MAX_BATCH_CELLS, min_length=1)
    attribute: bool = Field(False, description="Attribute divergences to template lines (slower)")


class BatchSummary(BaseModel):
    cells: int
    judged: int = Field(description="Cells inside the conformance denominator (the engine ran them, a golden exists)")
    passed: int
    not_run: int
    counts: dict[str, int]
    conformance: Optional[float] = Field(description="passed / judged, percent")
    ran: Optional[float] = Field(description="judged / cells, percent")


class BatchResult(BaseModel):
    results: list[CheckResult]
    summary: BatchSummary


class GoldensRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    template: str = Field(max_length=MAX_TEMPLATE_BYTES, description=f"Template text (at most {MAX_TEMPLATE_BYTES} bytes)")
    bos_token: Optional[str] = Field(None, max_length=1000)
    eos_token: Optional[str] = Field(None, max_length=1000)
    cases: Optional[list[str]] = Field(None, max_length=200,
                                       description="Case id globs; all cases when omitted")


class CompatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    template: str = Field(max_length=MAX_TEMPLATE_BYTES, description=f"Template text (at most {MAX_TEMPLATE_BYTES} bytes)")
    bos_token: Optional[str] = Field(None, max_length=1000)
    eos_token: Optional[str] = Field(None, max_length=1000)
    engines: Optional[list[str]] = Field(None, min_length=1, max_length=COMPAT_MAX_ENGINES,
                                         description="The suite's engines to run (names as `chatgold engines` lists "
                                                     "them); compat's default set when omitted")
    cases: Optional[list[str]] = Field(None, max_length=200, description="Case id globs; all cases when omitted")


class NewGolden(BaseModel):
    case: str
    kind: Literal["rendered", "raised", "errored", "not-run"] = Field(
        description="errored: the reference process failed or ran out of time; not-run: the overall time ran out")
    text: str


class GoldensResult(BaseModel):
    sha256: str
    corpus_id: Optional[str] = Field(description="The corpus template with the same bytes, if any")
    reference: dict[str, str]
    complete: bool
    goldens: list[NewGolden]


class IdentifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["template"]}, {"required": ["sha256"]}]})
    template: Optional[str] = Field(None, max_length=MAX_TEMPLATE_BYTES * 4)
    sha256: Optional[str] = Field(None, pattern=SHA256_PATTERN)

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.template is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `template` (the text) or `sha256` (lowercase hex)")
        return self


class IdentifyResult(BaseModel):
    sha256: str
    matched: bool
    template: Optional[TemplateSummary] = None
    hint: Optional[str] = None
