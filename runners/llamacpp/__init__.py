"""The llama.cpp runner: a real llama-server, built from the pinned source, fed real GGUF files.

`build_llama_server()` builds (or finds in the cache) the binary; `LlamaCppRunner` renders through it with
`--jinja`, `LlamaCppBuiltinRunner` with `--no-jinja` (llama.cpp's built-in formats).
See docs/llamacpp.md.
"""
from .build import (
    LLAMA_CPP_TAG,
    LlamaCppBuildError,
    build_llama_server,
    find_llama_server,
)
from .builtin_runner import LlamaCppBuiltinRunner
from .runner import LlamaCppRunner

__all__ = ["LLAMA_CPP_TAG", "LlamaCppBuildError", "LlamaCppBuiltinRunner", "LlamaCppRunner", "build_llama_server",
           "find_llama_server"]
