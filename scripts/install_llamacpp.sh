#!/usr/bin/env bash
# Install llama-cpp-python for specframe's llama.cpp engine, built so that a k-token batch gives each row the same
# logits as one-token decoding (docs/llamacpp.md, "Exactness"): portable AVX2 code (no -march=native, so the wheel
# runs on any AVX2 CPU), without the llamafile sgemm and the repacked weight layouts. pip compiles llama.cpp from
# the sdist (about 6 minutes on 2 cores); the wheel is kept in $SPECFRAME_CACHE/wheels/, keyed by the version and
# the build flags, so later venvs install it in seconds. pip's own wheel cache is bypassed: it is keyed by the
# sdist alone and would hand back a wheel built with other CMAKE_ARGS.
#
#   bash scripts/install_llamacpp.sh                 # into .venv (made by scripts/setup.sh)
#   PYTHON=/path/to/python bash scripts/install_llamacpp.sh
#   LLAMACPP_CMAKE_ARGS="..." bash scripts/install_llamacpp.sh   # other flags (then check them: lab/scripts/llamacpp_rows.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
VERSION=0.3.36
ARGS=${LLAMACPP_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_LLAMAFILE=OFF -DGGML_CPU_REPACK=OFF"}
if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null && [ -z "${LLAMACPP_CMAKE_ARGS:-}" ]; then
    echo "error: this CPU has no AVX2; set LLAMACPP_CMAKE_ARGS to flags it supports (see docs/llamacpp.md)" >&2
    exit 2
fi
CACHE=${SPECFRAME_CACHE:-$HOME/.cache/specframe}
KEY=$(printf '%s %s %s' "$VERSION" "$ARGS" "$("$PY" -c 'import sys; print(sys.implementation.cache_tag)')" | sha256sum | cut -c1-16)
WHEELS="$CACHE/wheels/llama-cpp-python-$KEY"
if ! ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $VERSION (CMAKE_ARGS=$ARGS); about 6 minutes on 2 cores" >&2
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    CMAKE_ARGS="$ARGS" "$PY" -m pip wheel -q --no-cache-dir --no-deps -w "$TMP" "llama-cpp-python==$VERSION" 2>&1 \
        | grep -v "^WARNING: Location" || true
    ls "$TMP"/llama_cpp_python-*.whl >/dev/null  # (fails here when the build failed)
    mkdir -p "$WHEELS"
    mv "$TMP"/llama_cpp_python-*.whl "$WHEELS"/
fi
# its runtime dependencies from PyPI, the wheel itself from the cache
"$PY" -m pip install -q "numpy>=1.20" "typing-extensions>=4.5" "diskcache>=5.6" "jinja2>=2.11" 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -m pip install -q --no-deps --force-reinstall "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, '|', llama_cpp.llama_print_system_info().decode().strip())"
