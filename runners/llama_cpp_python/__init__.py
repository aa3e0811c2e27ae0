"""llama-cpp-python as `Llama.create_chat_completion` renders a chat request: the real PyPI package.

The package (abetlen/llama-cpp-python) is built from its PyPI sdist, CPU-only, into the cache (build.py) and
driven in a harness process running that installation's interpreter (harness.py): a tiny GGUF carrier holding
the template and the model's BOS/EOS texts (runners/llamacpp/model.py) is loaded with `Llama(model_path=...)`,
so `Llama.__init__` does what it does for a real model: reads `tokenizer.chat_template`, takes BOS/EOS texts
from the vocabulary, builds a `Jinja2ChatFormatter` for the template, and picks a hand-written format instead
when the template is byte-identical to one it knows (`guess_chat_format_from_gguf_metadata`). Each cell is one
real `create_chat_completion(messages=..., tools=...)` call; the prompt text is taken where the handler
tokenizes it, and the call is stopped before generating.
"""
from __future__ import annotations

from typing import Optional

from ..command import CommandRunner
from . import build

HOMEPAGE = "https://github.com/abetlen/llama-cpp-python"


class LlamaCppPythonRunner(CommandRunner):
    """The real llama-cpp-python (built from the PyPI sdist, cached per version) in a harness process."""

    language = "python"
    homepage = HOMEPAGE
    cost_hint = 3.0  # a model load per template

    def __init__(self, timeout: float = 20.0, workers: int = 1, version: Optional[str] = None, **options):
        from ..versions import checkout_harness

        python = build.ensure_built(version or build.PINNED_VERSION)
        argv, env = checkout_harness(python, "runners.llama_cpp_python.harness")
        env = dict(env, TZ="UTC")
        name = "llama-cpp-python" if version is None else f"llama-cpp-python@{version}"
        super().__init__(argv, name=name, timeout=timeout, workers=workers, env=env, **options)
        self.version = version or build.PINNED_VERSION

    def identity(self) -> Optional[dict]:
        """What decides its outcomes: the install (requirements and build options the cache recorded), this
        interpreter, and the harness code with the GGUF carrier it writes. None (never cached) without a record."""
        from ..identity import PROTOCOL_FILES, python_identity, source_digest

        record = build.build_info(self.version)
        if record is None:
            return None
        install = {k: record[k] for k in ("requirements", "pip_options", "env") if k in record}
        return {"name": self.name, "version": self.version, "install": install, "python": python_identity(),
                "code": source_digest(*PROTOCOL_FILES, "llama_cpp_python", "llamacpp/model.py", "hf.py", "vocab.py")}
