#!/usr/bin/env bash
# Prepare a call of the lent GPU machine (docs/gpu.md): the wheels its image lacks, the size of what travels, and the
# one-line command that runs scripts/gpu_smoke.py there.
#
#   bash scripts/gpu_pack.sh download   # wheels into .whl/ (pinned to this venv's versions), /.whl/ in .git/info/exclude
#   bash scripts/gpu_pack.sh --check    # MiB that would travel (tracked files present + untracked-not-ignored +
#                                       # shared/ + .whl) against the 64 MiB limit; exit 1 when over
#   bash scripts/gpu_pack.sh stash      # move plugins/weights/<target>/ and lab/results/ to ../gpu-stash (the tree is
#                                       # ~112 MiB with them); refuses when those paths have uncommitted changes
#   bash scripts/gpu_pack.sh restore    # move them back (safe to run twice); ALWAYS restore before committing
#   bash scripts/gpu_pack.sh command    # print the device command (at most 2000 characters)
#   bash scripts/gpu_pack.sh            # download, --check, command
#
# Environment: PYTHON (default .venv/bin/python: whose package versions are pinned), PY_VERSION (default 3.12, the
# device's python3), GPU_STASH (default ../gpu-stash beside the checkout), WHL_DIR (default .whl).
set -euo pipefail

ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || [ "${1:-all}" = download ] || [ "${1:-all}" = all ] || PYTHON=python3  # (--check needs no venv)
PY_VERSION=${PY_VERSION:-3.12}
WHL_DIR=${WHL_DIR:-.whl}
STASH=${GPU_STASH:-$(dirname "$ROOT")/gpu-stash}
LIMIT_MIB=64
STASHED_PATHS=(plugins/weights lab/results)  # of plugins/weights only the weight folders move (its __init__.py stays)

# What the device image ('cuda', docs/gpu.md) lacks or has too old, for `import specframe`, the engine, the grammar
# stage and the package's own build:
#  - pydantic and its parts (the configs), llguidance (structured output): absent there;
#  - transformers (the engine needs >= 5.24; the image had 5.17) with what this transformers needs at import:
#    huggingface-hub 2.x (+ httpx2, httpcore2, truststore, hf-xet), kernels (+ tomlkit), regex (checked at import);
#  - typing-extensions (pydantic's floor), setuptools >= 77 (pip builds this package there, no build isolation);
#  - jsonschema and its parts (tests/decode/test_constraints.py imports it: `pytest -m device_subset` collects it).
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions llguidance
          transformers huggingface-hub httpx2 httpcore2 truststore hf-xet kernels tomlkit regex setuptools
          jsonschema jsonschema-specifications referencing rpds-py)

die() { echo "gpu_pack: $*" >&2; exit 1; }

pinned() {  # NAME==VERSION for each package, from $PYTHON's environment
    [ -x "$PYTHON" ] || die "$PYTHON not found: set PYTHON to the environment whose versions the wheels pin"
    "$PYTHON" - "${PACKAGES[@]}" <<'EOF'
import sys
from importlib import metadata
missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed in this environment (cannot pin): {' '.join(missing)}")
EOF
}

exclude() {  # add a line to .git/info/exclude once
    local git_dir
    git_dir=$(git rev-parse --git-common-dir)
    mkdir -p "$git_dir/info"
    grep -qxF "$1" "$git_dir/info/exclude" 2>/dev/null || echo "$1" >>"$git_dir/info/exclude"
}

download() {
    exclude "/$WHL_DIR/"
    mkdir -p "$WHL_DIR"
    local specs
    specs=$(pinned) || die "pinning failed"
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
                     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
                     --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
    local spec name
    for spec in $specs; do
        name=${spec%%==*}
        # one version of each: drop another version left from an earlier download (two stop the whole install)
        local norm=${name//-/_}
        find "$WHL_DIR" -maxdepth 1 -type f -iname "${norm}-*.whl" ! -iname "${norm}-${spec##*==}-*.whl" -print -delete
        python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
            "${platforms[@]}" -d "$WHL_DIR" "$spec" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) || die "no wheel of $spec for python $PY_VERSION manylinux x86_64"
    done
    echo "gpu_pack: $(find "$WHL_DIR" -maxdepth 1 -type f -name '*.whl' | wc -l) wheels in $WHL_DIR/ ($(du -sm "$WHL_DIR" | cut -f1) MiB):"
    ls "$WHL_DIR"
}

check() {  # the bytes that would travel, as the tool counts them
    "$PYTHON" - "$WHL_DIR" "$LIMIT_MIB" <<'EOF'
import os, subprocess, sys
whl, limit = sys.argv[1], float(sys.argv[2])
def ls(*args):
    out = subprocess.run(["git", "ls-files", "-z", *args], check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]
def size(p):
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    return st.st_size
parts, tops = {}, {}
for label, paths in (("tracked (present)", ls()), ("untracked, not ignored", ls("-o", "--exclude-standard"))):
    total = 0
    for p in paths:
        s = size(p)
        if s is None:
            continue
        total += s
        top = p.split("/")[0] if "/" not in p else "/".join(p.split("/")[:2])
        tops[top] = tops.get(top, 0) + s
    parts[label] = total
for label, folder in (("shared/", "shared"), (whl + "/ (carried)", whl)):
    total = 0
    for d, _, files in os.walk(folder):
        total += sum(size(os.path.join(d, f)) or 0 for f in files)
    parts[label] = total
mib = lambda b: b / 2**20
for label, b in parts.items():
    print(f"  {label:28s} {mib(b):7.1f} MiB")
total = sum(parts.values())
print("  largest folders:", ", ".join(f"{k} {mib(v):.1f}" for k, v in sorted(tops.items(), key=lambda kv: -kv[1])[:6]))
verdict = "fits" if mib(total) <= limit else "OVER: run `bash scripts/gpu_pack.sh stash` first"
print(f"gpu_pack: {mib(total):.1f} MiB would travel, limit {limit:.0f} MiB: {verdict}")
sys.exit(0 if mib(total) <= limit else 1)
EOF
}

stash_items() {  # the entries that move: plugins/weights/* but its __init__.py (and caches), lab/results
    local p
    for p in plugins/weights/*; do
        case $(basename "$p") in __init__.py | __pycache__) ;; *) [ -e "$p" ] && echo "$p" ;; esac
    done
    [ -e lab/results ] && echo lab/results
    return 0
}

stash() {
    local dirty
    dirty=$(git status --porcelain --untracked-files=all -- "${STASHED_PATHS[@]}")
    [ -z "$dirty" ] || die "refusing to stash: uncommitted changes under ${STASHED_PATHS[*]} (commit or move them first):
$dirty"
    mapfile -t items < <(stash_items)
    [ ${#items[@]} -gt 0 ] || { echo "gpu_pack: nothing to stash (already stashed?)"; return 0; }
    mkdir -p "$STASH"
    local item
    for item in "${items[@]}"; do
        [ ! -e "$STASH/$item" ] || die "$STASH/$item exists already: run restore first, or remove it"
    done
    for item in "${items[@]}"; do
        # git keeps the files as they are in the index and ignores their absence: `git commit -a` cannot delete them
        git ls-files -z -- "$item" | xargs -0 -r git update-index --skip-worktree --
        mkdir -p "$STASH/$(dirname "$item")"
        mv "$item" "$STASH/$item"
        echo "$item" >>"$STASH/MANIFEST"
        echo "gpu_pack: stashed $item -> $STASH/$item"
    done
    echo "gpu_pack: restore with: bash scripts/gpu_pack.sh restore   (before any commit)"
}

restore() {
    if [ ! -f "$STASH/MANIFEST" ]; then
        echo "gpu_pack: nothing to restore ($STASH/MANIFEST absent)"
        return 0
    fi
    local item left=()
    while IFS= read -r item; do
        [ -n "$item" ] || continue
        if [ -e "$STASH/$item" ]; then
            if [ -e "$item" ]; then
                if diff -rq "$STASH/$item" "$item" >/dev/null; then
                    rm -rf "${STASH:?}/$item"  # already back (e.g. checked out again): the copy is the same
                else
                    echo "gpu_pack: $item exists and differs from $STASH/$item: left in the stash" >&2
                    left+=("$item")
                    continue
                fi
            else
                mkdir -p "$(dirname "$item")"
                mv "$STASH/$item" "$item"
            fi
        fi
        git ls-files -z -- "$item" | xargs -0 -r git update-index --no-skip-worktree --
        echo "gpu_pack: restored $item"
    done <"$STASH/MANIFEST"
    if [ ${#left[@]} -gt 0 ]; then
        printf '%s\n' "${left[@]}" >"$STASH/MANIFEST"
        die "some paths were left in $STASH (see above)"
    fi
    rm -f "$STASH/MANIFEST"
    find "$STASH" -depth -type d -empty -delete 2>/dev/null || true
    git status --short -- "${STASHED_PATHS[@]}"
}

command_line() {
    local cmd
    # the package is installed (not only put on PYTHONPATH): its plugins register through its entry points alone
    cmd="set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHL_DIR/*.whl && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --upgrade --target /tmp/site . && export PYTHONUNBUFFERED=1 && python3 scripts/gpu_smoke.py --device cuda --out \$OUT 2>&1 | tee \$OUT/smoke.log"
    [ ${#cmd} -le 2000 ] || die "the command is ${#cmd} characters, over 2000"
    echo "gpu_pack: device command (${#cmd} characters; carry [\"$WHL_DIR\"], timeout_s 600):"
    echo "$cmd"
}

case "${1:-all}" in
download) download ;;
--check | check) check ;;
stash) stash ;;
restore) restore ;;
command) command_line ;;
all)
    download
    check || true
    command_line
    ;;
*) die "usage: bash scripts/gpu_pack.sh [download|--check|stash|restore|command]" ;;
esac
