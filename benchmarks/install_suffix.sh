#!/usr/bin/env bash
# Usage: benchmarks/install_suffix.sh [--rebuild]
#
# Makes vLLM's built-in `suffix` speculative method (SuffixDecoding) usable in the project venv,
# FOR BENCHMARKS ONLY (it is deliberately not a dependency of vllm_treespec: setup.py does not
# list it). vLLM 0.32.0 implements `method: suffix` with the C++ suffix tree of the
# `arctic-inference` package (vllm/v1/spec_decode/suffix_decoding.py does
# `from arctic_inference.suffix_decoding import SuffixDecodingCache`; vllm/config/speculative.py
# refuses the method unless `arctic_inference` is importable). PyPI has no CPU/manylinux wheel of
# arctic-inference 0.3.0, only an sdist, so this script
#   1. builds the wheel from the sdist in a throwaway build venv (its build requirements, notably
#      protobuf==5.29.6 and grpcio-tools, never touch the project venv, which keeps its protobuf),
#   2. caches it in ${XDG_CACHE_HOME:-$HOME/.cache}/vllm_treespec/wheels/ (the wheel's file name
#      carries version and Python tag; an existing cached wheel skips the build; --rebuild forces
#      one),
#   3. installs it into the project venv with `pip install --no-deps` (the wheel declares no
#      runtime requirements anyway; --no-deps guarantees nothing else in the venv moves),
#   4. checks that `arctic_inference.suffix_decoding` imports and works, that vLLM sees it, and
#      that arctic-inference's vLLM plugin stays inert (see below).
# Idempotent: run it again and it only re-checks.
#
# Environment: VENV (project venv, default <repo>/.venv), BUILD_JOBS (compile jobs, default 2),
# ARCTIC_SDIST (path to an already downloaded arctic_inference-0.3.0.tar.gz; checked against the
# pinned sha256 like a download).
#
# arctic-inference's vLLM plugin: the wheel registers the entry point
#   [vllm.general_plugins] arctic_inference = arctic_inference.vllm.plugin:arctic_inference_plugin
# so every vLLM process in the venv (treespec servers and no-speculation baselines included)
# imports and calls it. In 0.3.0 the call returns at once unless ARCTIC_INFERENCE_ENABLED=1
# (arctic_inference/vllm/plugin.py lines 27-29; envs.py line 42: default "0"), before any patch
# is imported; importing the module itself only loads vllm, vllm.platforms and two small arctic
# modules without side effects. So installing it does not change how other vLLM servers behave
# as long as ARCTIC_INFERENCE_ENABLED is unset (or not "1"). With ARCTIC_INFERENCE_ENABLED=1 it
# would raise "requires the cuda platform" on this CPU build (and, on a GPU, refuse vLLM 0.32.0
# because its patches target 0.26.0). To keep it out of a process entirely, set
# VLLM_PLUGINS=vllm_treespec (vLLM's allowlist of general plugins).
set -euo pipefail

ARCTIC_VERSION=0.3.0
SDIST_NAME="arctic_inference-${ARCTIC_VERSION}.tar.gz"
SDIST_URL="https://files.pythonhosted.org/packages/63/c1/573fa2f00097cd9cc1167b31fd900b2482f58f3491867cebdd5516626533/${SDIST_NAME}"
SDIST_SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
# Build requirements of the sdist's pyproject.toml, minus torch (see the setup.py patch below).
# protobuf==5.29.6 is pinned upstream so that grpcio-tools' generated embedding stubs match it.
BUILD_REQS=(setuptools wheel ninja cmake nanobind==2.9.2 protobuf==5.29.6 grpcio-tools)

REBUILD=0
case "${1:-}" in
    "") ;;
    --rebuild) REBUILD=1 ;;
    -h|--help) sed -n '2,3p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--rebuild]" >&2; exit 2 ;;
esac

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO_ROOT/.venv}"
VENV_PY="$VENV/bin/python"
BUILD_JOBS="${BUILD_JOBS:-2}"
WHEEL_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vllm_treespec/wheels"

say() { echo "[install_suffix] $*"; }

[[ -x "$VENV_PY" ]] || { echo "[install_suffix] no python at $VENV_PY (set VENV)" >&2; exit 1; }
if [[ "${ARCTIC_INFERENCE_ENABLED:-0}" == "1" ]]; then
    say "warning: ARCTIC_INFERENCE_ENABLED=1 is set; unset it, or every vLLM process in this" \
        "venv fails on CPU (the arctic plugin demands CUDA). Checks below run with it unset."
fi

# The wheel is CPython-version specific (nanobind extension): key the cache on the venv's tag.
PY_TAG="$("$VENV_PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
# Same interpreter the project venv was made from, so the build venv produces a matching wheel.
BASE_PY="$("$VENV_PY" -c 'import sys; print(sys._base_executable)')"

find_cached_wheel() {
    local w
    for w in "$WHEEL_DIR"/arctic_inference-"$ARCTIC_VERSION"-"$PY_TAG"-"$PY_TAG"-*.whl; do
        [[ -f "$w" ]] && { echo "$w"; return 0; }
    done
    return 1
}

build_wheel() {
    local tmp
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/arctic-build.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT

    local sdist="$tmp/$SDIST_NAME"
    if [[ -n "${ARCTIC_SDIST:-}" ]]; then
        say "using sdist $ARCTIC_SDIST"
        cp "$ARCTIC_SDIST" "$sdist"
    else
        # Not `pip download`: for an sdist pip always prepares its metadata, i.e. runs setup.py,
        # which imports torch (absent from the build venv) before we can patch it.
        say "downloading $SDIST_NAME from PyPI"
        "$BASE_PY" - "$SDIST_URL" "$sdist" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=180) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
EOF
    fi
    echo "$SDIST_SHA256  $sdist" | sha256sum -c --quiet - \
        || { echo "[install_suffix] sha256 mismatch for $sdist" >&2; exit 1; }
    tar -xzf "$sdist" -C "$tmp"
    local src="$tmp/arctic_inference-$ARCTIC_VERSION"

    # Patch: setup.py imports torch at module level, only to pass TORCH_CMAKE_PREFIX_PATH to CMake
    # and to pick a CUDA arch under ARCTIC_MINIMAL_BUILD. Both matter only for the CUDA
    # `custom_ops` extension, which setup.py builds only when ARCTIC_INFERENCE_PRECOMPILED_OPS=1
    # (we leave it unset, so the sole extension is `arctic_inference.suffix_decoding._C`, whose
    # CMakeLists.txt needs Python + nanobind, not torch). Making the import optional spares the
    # build venv a ~200 MB torch install. No environment variable is needed to limit the build
    # to the suffix-decoding extension: that is setup.py's default.
    "$BASE_PY" - "$src/setup.py" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
edits = [
    ("\nimport torch\n",
     "\ntry:  # patched by vllm_treespec benchmarks/install_suffix.sh: torch only for custom_ops\n"
     "    import torch\nexcept ImportError:\n    torch = None\n"),
    ('            f"-DTORCH_CMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",\n',
     '        ] + ([f"-DTORCH_CMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"]\n'
     '             if torch is not None else []) + [\n'),
    ("if minimal_build_env and torch.cuda.is_available():",
     "if minimal_build_env and torch is not None and torch.cuda.is_available():"),
]
for old, new in edits:
    if text.count(old) != 1:
        sys.exit(f"setup.py patch: expected exactly one {old!r}")
    text = text.replace(old, new)
open(path, "w").write(text)
EOF

    say "creating build venv $tmp/venv from $BASE_PY"
    "$BASE_PY" -m venv "$tmp/venv"
    say "installing build requirements into the build venv: ${BUILD_REQS[*]}"
    "$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "${BUILD_REQS[@]}"

    say "building the wheel (suffix_decoding._C only, $BUILD_JOBS jobs)"
    # The build venv goes first on PATH (so setup.py's bare `cmake` is the venv's) and is named
    # to CMake's FindPython via CMAKE_ARGS: setup.py only passes the legacy PYTHON_EXECUTABLE,
    # so FindPython would otherwise pick the first python3 on PATH, which lacks nanobind.
    (cd "$src" && env -u ARCTIC_INFERENCE_PRECOMPILED_OPS PATH="$tmp/venv/bin:$PATH" \
        VIRTUAL_ENV="$tmp/venv" CMAKE_ARGS="-DPython_EXECUTABLE=$tmp/venv/bin/python" \
        CMAKE_BUILD_PARALLEL_LEVEL="$BUILD_JOBS" MAX_JOBS="$BUILD_JOBS" \
        "$tmp/venv/bin/pip" wheel --quiet --disable-pip-version-check \
        --no-deps --no-build-isolation --wheel-dir "$tmp/dist" .)

    local built
    built="$(ls "$tmp"/dist/arctic_inference-"$ARCTIC_VERSION"-"$PY_TAG"-"$PY_TAG"-*.whl)"
    mkdir -p "$WHEEL_DIR"
    # Copy under a temporary name, then rename: a cut-short run never leaves a half wheel cached.
    cp "$built" "$WHEEL_DIR/.partial.$$"
    mv "$WHEEL_DIR/.partial.$$" "$WHEEL_DIR/$(basename "$built")"
    say "cached $WHEEL_DIR/$(basename "$built")"
    rm -rf "$tmp"
    trap - EXIT
}

installed_version() {
    "$VENV_PY" -c 'import importlib.metadata as m
try: print(m.version("arctic-inference"))
except m.PackageNotFoundError: pass'
}

if [[ "$(installed_version)" == "$ARCTIC_VERSION" && $REBUILD == 0 ]]; then
    say "arctic-inference $ARCTIC_VERSION already installed in $VENV"
else
    if [[ $REBUILD == 1 ]] || ! WHEEL="$(find_cached_wheel)"; then
        build_wheel
        WHEEL="$(find_cached_wheel)"
    else
        say "using cached wheel $WHEEL (no build)"
    fi
    say "installing $WHEEL into $VENV (--no-deps)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
fi

say "checking the install"
env -u ARCTIC_INFERENCE_ENABLED "$VENV_PY" - <<'EOF'
import sys

# What vLLM 0.32.0 imports for `method: suffix` (vllm/v1/spec_decode/suffix_decoding.py).
from arctic_inference.suffix_decoding import SuffixDecodingCache

cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=16)
cache.start_request("r", [1, 2, 3, 4, 1, 2, 3])
cache.add_active_response("r", [4])
draft = cache.speculate("r", [3, 4], max_spec_tokens=4)
print(f"[install_suffix] arctic_inference.suffix_decoding OK (draft after [3, 4]: {list(draft.token_ids)})")

from vllm.utils.import_utils import has_arctic_inference
assert has_arctic_inference(), "vLLM does not see arctic_inference"
print("[install_suffix] vllm.utils.import_utils.has_arctic_inference() = True")

# The vLLM general plugin the wheel registers must do nothing unless ARCTIC_INFERENCE_ENABLED=1.
from arctic_inference.vllm.plugin import arctic_inference_plugin
arctic_inference_plugin()
assert "arctic_inference.vllm.patches" not in sys.modules, "arctic plugin applied its patches"
print("[install_suffix] arctic_inference vLLM plugin is inert (ARCTIC_INFERENCE_ENABLED unset)")
EOF
say "done: use speculative_config {\"method\": \"suffix\", \"num_speculative_tokens\": K, ...};" \
    "keep ARCTIC_INFERENCE_ENABLED unset"
