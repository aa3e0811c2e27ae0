"""vLLM 0.33.0's chat layer run from the wheel's own files: what the `vllm` runner renders with.

Every module of the `vllm` package imports torch (`vllm/__init__.py` -> `env_override.py:150`), which the text
chat layer never uses; the wheel pins torch 2.14.0 (a 555 MB wheel, 1.1 GB installed, plus CUDA wheels), and
the vllm wheel itself unpacks to 840 MB of mostly GPU kernels. So the chat layer's modules are executed from the
wheel's files, unchanged, except that their imports of other vLLM modules (and of torch) are bound to named
objects (`load_module`): the wheel's own objects where the chat layer uses them (vllm/exceptions.py,
renderers/chat_utils/types.py, chat_message.py, renderers/params.py, utils/func_utils.py, the request models of
the protocol files), a text-only model's configuration and multimodal tracker where it asks for one, and an
`Unavailable` object, which raises if it is ever used, for everything else: nothing is silently stood in for.
The files come from the PyPI wheel (`pip download vllm==0.33.0`), each checked against the wheel's RECORD hash,
and only they are kept (<cache>/sources/vllm-0.33.0); the environment holds transformers 5.20.2 (vLLM 0.33.0
requires <5.21.0), jinja2, and the pure-Python packages the chat layer imports (openai, pydantic, pillow,
oss-harmony).

The wheel's code: message validation (pydantic over vLLM's `ChatCompletionMessageParam` union,
chat_completion/protocol.py:238), tools validation and `model_dump` (:206-223), `build_chat_params` (:643-682),
`ChatParams.with_defaults` and `merge_kwargs` (renderers/params.py), content-format detection and
`safe_apply_chat_template` (renderers/hf.py), `parse_chat_messages` with `_postprocess_messages`
(chat_utils/chat_message.py), over transformers' apply_chat_template. Written here, each at its line: the
`reasoning_content` rename (protocol.py:576-601, a pydantic `before` validator of the request model), the
both-flags check (:1058-1068) and the `preprocess_chat` defaults {tools, tokenize} (online_renderer.py:787-796).
"""
from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

from .base import Outcome, Raised, RefusalKind, Rendered, RenderRequest, Skipped, refusal_of

BAD_REQUEST = "400 Bad Request: "

WHEEL_VERSION = "0.33.0"
TRANSFORMERS_VERSION = "5.20.2"
REQUIREMENTS = [f"transformers=={TRANSFORMERS_VERSION}", "jinja2==3.1.6", "openai==3.57.0", "oss-harmony==0.0.11",
                "pillow==13.0.0", "pydantic==2.14.4"]
# The wheel's files the chat layer runs (paths inside the wheel).
FILES = (
    "vllm/exceptions.py",
    "vllm/utils/func_utils.py",
    "vllm/renderers/params.py",
    "vllm/renderers/hf.py",
    "vllm/renderers/chat_utils/types.py",
    "vllm/renderers/chat_utils/chat_message.py",
    "vllm/renderers/chat_utils/content_parser.py",
    "vllm/entrypoints/serve/engine/protocol.py",
    "vllm/entrypoints/generate/base/protocol.py",
    "vllm/entrypoints/openai/chat_completion/protocol.py",
)
MARKER = "chatgold-sources.json"


def sources_dir() -> Path:
    from .versions import cache_root

    return cache_root() / "sources" / f"vllm-{WHEEL_VERSION}"


def _record_hashes(wheel: zipfile.ZipFile) -> dict:
    record = next(name for name in wheel.namelist() if name.endswith(".dist-info/RECORD"))
    hashes = {}
    for line in wheel.read(record).decode("utf-8").splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest.startswith("sha256="):
            hashes[path] = digest[len("sha256="):]
    return hashes


def ensure_sources() -> Path:
    """The wheel's chat-layer files under <cache>/sources/vllm-VERSION, downloaded once (the wheel is not kept)."""
    import shutil
    import subprocess
    import tempfile

    from .base import RunnerUnavailable
    from .versions import _check_install, cache_lock

    target = sources_dir()
    if (target / MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"sources-vllm-{WHEEL_VERSION}"):
        if (target / MARKER).exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".staging-vllm-", dir=target.parent))
        try:
            print(f"[chatgold] downloading the vllm {WHEEL_VERSION} wheel for its chat-layer sources",
                  file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                   "--disable-pip-version-check", "--no-input", f"vllm=={WHEEL_VERSION}", "-d",
                                   str(staging / "wheel")], capture_output=True, text=True, timeout=1800)
            _check_install(done, f"vllm {WHEEL_VERSION}", "PyPI", "pip")
            wheel_path = next((staging / "wheel").glob("vllm-*.whl"))
            with zipfile.ZipFile(wheel_path) as wheel:
                hashes = _record_hashes(wheel)
                for name in FILES:
                    data = wheel.read(name)
                    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    if hashes.get(name) != digest:
                        raise RunnerUnavailable(f"vllm {WHEEL_VERSION}: {name} does not match the wheel's RECORD")
                    out = staging / "src" / name
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(data)
            (staging / "src" / MARKER).write_text(json.dumps({"wheel": wheel_path.name, "files": list(FILES)}) + "\n")
            if target.exists():
                shutil.rmtree(target)
            (staging / "src").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_environment() -> Path:
    """The python of the cached environment the wheel's chat layer runs in (its sources are fetched too)."""
    from .versions import ensure_venv

    ensure_sources()
    return ensure_venv(f"vllm-{WHEEL_VERSION}", REQUIREMENTS, f"vllm {WHEEL_VERSION}'s chat layer",
                       pip_options=["--only-binary", ":all:"])


# -- loading the wheel's modules without the rest of vLLM ---------------------------------------------------------
class Unavailable:
    """Stands for a vLLM module or object the text-only chat layer must not reach: any use raises."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr):
        raise RuntimeError(f"the oracle reached {self._name}.{attr}, which it does not load")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"the oracle reached {self._name}(), which it does not load")

    def __getitem__(self, item):  # a subscripted annotation of an unloaded generic (never evaluated lazily)
        raise RuntimeError(f"the oracle reached {self._name}[...], which it does not load")


class OnceLogger:
    """vllm.logger's logger interface (info_once, warning_once, ...) over a silent standard logger."""

    def __init__(self, name: str):
        import logging

        self._logger = logging.getLogger(f"chatgold.vllm.{name}")
        self._logger.propagate = False
        self._logger.addHandler(logging.NullHandler())

    def __getattr__(self, attr):
        base = attr[:-len("_once")] if attr.endswith("_once") else attr
        return getattr(self._logger, base)


def _defines(node) -> set:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def load_module(path: Path, provided: dict, only=None, skip=(), absent=("torch",), lazy_annotations=False) -> dict:
    """Execute a wheel file's top-level statements in a fresh namespace and return it. Imports of vLLM modules
    (absolute or relative) and of `absent` modules are bound to `provided[name]` or an Unavailable; `only` keeps
    just the definitions it names (and every other import), `skip` leaves definitions out."""
    import __future__

    import types

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    # A real module object: dataclasses and pydantic resolve string annotations through sys.modules.
    module = types.ModuleType(f"chatgold_vllm.{'.'.join(path.with_suffix('').parts[-3:])}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    namespace: dict = module.__dict__
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ("vllm", *absent)):
            for alias in node.names:
                name = alias.asname or alias.name
                namespace[name] = provided.get(name, Unavailable(f"{node.module}.{alias.name}"))
            continue
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("vllm", *absent) for a in node.names):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                namespace[name] = provided.get(name, Unavailable(alias.name))
            continue
        if isinstance(node, (ast.If,)) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        defined = _defines(node)
        if defined & set(skip):
            continue
        if only is not None and not isinstance(node, (ast.Import, ast.ImportFrom)) and not defined & set(only):
            continue
        body.append(node)
    flags = __future__.annotations.compiler_flag if lazy_annotations else 0
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True),
         namespace)
    return namespace


def _class_method(path: Path, class_name: str, method: str, namespace: dict):
    """One method of a class in a wheel file, as a plain function executed in `namespace`."""
    import __future__

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec",
                 flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)
    return namespace[method]


class MediaPart(Exception):
    pass


class TextOnlyParser:
    """The content parser of a text-only model: no placeholders; a media part stops the request (the runner
    Skips such cells: they need a multimodal model)."""

    def __init__(self, model_config):
        self.model_config = model_config

    def mm_placeholder_storage(self) -> dict:
        return {}

    def __getattr__(self, attr):
        if attr.startswith("parse_"):
            def refuse(*args, **kwargs):
                raise MediaPart(attr[len("parse_"):])
            return refuse
        raise AttributeError(attr)


class TextOnlyTracker:
    """MultiModalItemTracker for a text-only model (renderers/chat_utils/item_tracker.py): holds no items."""

    def __init__(self, model_config, media_io_kwargs=None):
        self.model_config = model_config

    def create_parser(self, mm_processor_kwargs=None):
        return TextOnlyParser(self.model_config)

    def get_num_items(self, modality) -> int:
        return 0

    def resolve_items(self):
        return None, None


def text_model_config():
    """The fields of a text-only model's ModelConfig the chat layer reads."""
    from types import SimpleNamespace

    return SimpleNamespace(multimodal_config=None, enable_prompt_embeds=False, revision=None, code_revision=None,
                           tokenizer_revision=None, trust_remote_code=False, tokenizer="chatgold", model="chatgold",
                           hf_config=SimpleNamespace(model_type="chatgold"))


class WheelRenderer:
    """vLLM 0.33.0's chat layer, loaded from the wheel's files (see the module docstring)."""

    def __init__(self, root: Path):
        src = lambda name: root / name  # noqa: E731
        exceptions = load_module(src("vllm/exceptions.py"), {})
        func_utils = load_module(src("vllm/utils/func_utils.py"), {"init_logger": OnceLogger},
                                 only={"_supports_kw", "supports_kw", "logger", "T", "P"}, lazy_annotations=True)
        types_ns = load_module(src("vllm/renderers/chat_utils/types.py"), {})
        content_parser = load_module(src("vllm/renderers/chat_utils/content_parser.py"), {},
                                     only={"PROMPT_EMBEDS_PLACEHOLDER_TOKEN"}, lazy_annotations=True)
        common = {"VLLMValidationError": exceptions["VLLMValidationError"],
                  "ChatTemplateResolutionError": exceptions["ChatTemplateResolutionError"],
                  "init_logger": OnceLogger}
        type_names = {k: v for k, v in types_ns.items() if not k.startswith("__")}
        chat_message = load_module(src("vllm/renderers/chat_utils/chat_message.py"), {
            **common, **type_names, "MultiModalItemTracker": TextOnlyTracker,
            "PROMPT_EMBEDS_PLACEHOLDER_TOKEN": content_parser["PROMPT_EMBEDS_PLACEHOLDER_TOKEN"]},
            lazy_annotations=True)
        params = load_module(src("vllm/renderers/params.py"), {**common}, only={
            "merge_kwargs", "recursively_merge_kwargs", "map_reasoning_effort", "ChatParams", "logger"},
            lazy_annotations=True)
        # ChatParams.with_defaults merges media kwargs too; a text-only server has none, and vLLM's merge of
        # two absent values is None (multimodal/media/connector.py:142-143).
        params["merge_media_io_kwargs"] = lambda defaults, overrides: (
            None if not defaults and not overrides else Unavailable("merge_media_io_kwargs")())
        hf = load_module(src("vllm/renderers/hf.py"), {
            **common, **type_names, "parse_chat_messages": chat_message["parse_chat_messages"],
            "supports_kw": func_utils["supports_kw"]}, skip={"HfRenderer"})
        engine_protocol = load_module(src("vllm/entrypoints/serve/engine/protocol.py"), {**common},
                                      only={"OpenAIBaseModel", "_REMOVED_GUIDED_FIELDS", "logger"})
        base_protocol = load_module(src("vllm/entrypoints/generate/base/protocol.py"), {
            **common, "OpenAIBaseModel": engine_protocol["OpenAIBaseModel"]}, only={"FunctionDefinition", "logger"})
        chat_protocol = load_module(src("vllm/entrypoints/openai/chat_completion/protocol.py"), {
            **common, "OpenAIBaseModel": engine_protocol["OpenAIBaseModel"],
            "FunctionDefinition": base_protocol["FunctionDefinition"]}, only={"ChatCompletionToolsParam", "logger"})
        method_ns = {"map_reasoning_effort": params["map_reasoning_effort"], "merge_kwargs": params["merge_kwargs"],
                     "ChatParams": params["ChatParams"], "Any": __import__("typing").Any}
        self.build_chat_params = _class_method(src("vllm/entrypoints/openai/chat_completion/protocol.py"),
                                               "ChatCompletionRequest", "build_chat_params", method_ns)
        from pydantic import TypeAdapter

        self.messages_adapter = TypeAdapter(list[types_ns["ChatCompletionMessageParam"]])
        self.tools_model = chat_protocol["ChatCompletionToolsParam"]
        self.merge_kwargs = params["merge_kwargs"]
        self.hf = hf
        self.parse_chat_messages = chat_message["parse_chat_messages"]
        self.validation_error = exceptions["VLLMValidationError"]
        self.model_config = text_model_config()

    def render(self, request: RenderRequest) -> Outcome:
        """One cell through the wheel's chat layer: the request a client posts with the cell's conversation."""
        from types import SimpleNamespace

        import pydantic

        from .hf import HFRenderer, _frozen_now, parse_now

        if request.continue_final_message and request.add_generation_prompt:  # protocol.py:1058-1068
            return Raised(BAD_REQUEST + "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                          "True.", RefusalKind.RENDER)
        messages = json.loads(json.dumps(request.messages))
        for message in messages:  # protocol.py:576-601 (`_normalize_messages_before`)
            if isinstance(message, dict):
                reasoning_content = message.pop("reasoning_content", None)
                if reasoning_content is not None and message.get("reasoning") is None:
                    message["reasoning"] = reasoning_content
        try:
            messages = self.messages_adapter.validate_python(messages)  # protocol.py:238
            for message in messages:  # protocol.py:603-619 (`_materialize_tool_calls_after`)
                if isinstance(message, dict) and message.get("tool_calls") is not None \
                        and not isinstance(message["tool_calls"], list):
                    message["tool_calls"] = list(message["tool_calls"])
            tools = None if request.tools is None else [self.tools_model.model_validate(t) for t in request.tools]
        except pydantic.ValidationError as exc:
            return Raised(BAD_REQUEST + str(exc), RefusalKind.RENDER)
        tool_dicts = None if tools is None else [tool.model_dump() for tool in tools]  # online_renderer.py:297
        posted = SimpleNamespace(reasoning_effort=None, add_generation_prompt=request.add_generation_prompt,
                                 continue_final_message=request.continue_final_message,
                                 documents=request.documents, chat_template_kwargs=dict(request.kwargs) or None,
                                 chat_template=None, tools=tools, tool_choice="auto" if tools else "none",
                                 media_io_kwargs=None, response_format=None)
        defaults = self.merge_kwargs(None, dict(tools=tool_dicts, tokenize=False))  # online_renderer.py:787-796
        params = self.build_chat_params(posted, None, "auto", None).with_defaults(
            defaults, default_media_io_kwargs=None, default_mm_processor_kwargs=None)
        tokenizer = HFRenderer.tokenizer(request.bos_token, request.eos_token)
        tokenizer.chat_template = request.template  # the model's own template
        self.hf["_CONTENT_FORMATS"].clear()  # one model per server: the cache would answer for the last template
        token = _frozen_now.set(parse_now(request.now))
        try:
            content_format = self.hf["resolve_chat_template_content_format"](
                chat_template=params.chat_template, tools=params.chat_template_kwargs.get("tools"),
                given_format=params.chat_template_content_format, tokenizer=tokenizer,
                model_config=self.model_config)
            conversation, _, _ = self.parse_chat_messages(messages, self.model_config, content_format)
            text = self.hf["safe_apply_chat_template"](self.model_config, tokenizer, conversation,
                                                       **params.get_apply_chat_template_kwargs())
        except MediaPart as part:
            return Skipped(f"a {part.args[0]} part needs a multimodal model (vLLM fetches the media and inserts "
                           "the model's own placeholder)")
        except MemoryError:
            raise
        except self.validation_error as exc:  # a 400: the template's own error when one is in the chain
            inner = template_error(exc)
            kind = RefusalKind.RENDER if inner is exc else refusal_of(type(inner).__name__)
            return Raised(BAD_REQUEST + str(exc), kind)
        except Exception as exc:  # noqa: BLE001 - a failure outside the template's render (a 500 in vLLM)
            return Raised(f"{type(exc).__name__}: {exc}", refusal_of(type(template_error(exc)).__name__))
        finally:
            _frozen_now.reset(token)
        return Rendered(text)


def template_error(exc: BaseException) -> BaseException:
    """The innermost jinja2 error in an exception's chain (what vLLM reports, hf.py:834-844), else the exception."""
    import jinja2

    seen: set = set()
    current = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, jinja2.TemplateError):
            return current
        current = current.__cause__ or current.__context__
    return exc


if __name__ == "__main__":  # `python -m runners.vllm_wheel --install`: the environment and sources, once
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python -m runners.vllm_wheel --install")
    print(ensure_environment())
