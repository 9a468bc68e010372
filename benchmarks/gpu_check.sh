#!/usr/bin/env bash
# One command for a lent NVIDIA GPU (issue 4/4): build the CUDA extension, run every CUDA and
# Triton test for real, time the kernels on 8B-class shapes, run the engine-free tree decoding
# loop against plain decoding, and time 8B-class forwards for the speedup projection.
#
#   python benchmarks/gpu_carry.py .gpu_carry            # here: fixtures + tokenized prompts
#   bash benchmarks/gpu_check.sh OUTDIR .gpu_carry       # on the GPU machine, ~7 min on an H100
#   bash benchmarks/gpu_check.sh --dry-run OUTDIR        # anywhere: the CPU parts (CI runs it)
#
# The GPU machine has torch, triton, nvcc and pybind11 but no vLLM, so nothing here imports it.
# Each step gets a share of a global deadline (GPU_CHECK_BUDGET_S, default 420 s) and one
# failing step does not stop the others; GPU_CHECK_SKIP="name ..." leaves steps out. Results land in OUTDIR as JSON, logs in
# OUTDIR/gpu_check.log; the last lines printed are a summary table.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" = "--dry-run" ]; then
    out=${2:?usage: gpu_check.sh --dry-run OUTDIR}
    mkdir -p "$out"
    export TRITON_INTERPRET=1
    set -e
    "$PY" benchmarks/gpu_forward_costs.py --device cpu --tiny --out "$out"
    "$PY" benchmarks/gpu_loop.py --device cpu --tiny --out "$out"
    "$PY" benchmarks/bench_kernels.py --smoke --batches 1 --contexts 40 --trees 16 \
        --heads 4 2 --head-dim 32 --tune-s 1 --compaction-batches 2 --compaction-moves 3 \
        --methods causal_ours sdpa_dense_mask --out "$out/bench_kernels.json" > /dev/null
    bash -n "${BASH_SOURCE[0]}"
    echo "dry run ok: $out"
    exit 0
fi

out=${1:?usage: gpu_check.sh OUTDIR [CARRY_DIR]}
carry=${2:-.gpu_carry}
mkdir -p "$out"
log="$out/gpu_check.log"
export PYTHONUNBUFFERED=1
budget=${GPU_CHECK_BUDGET_S:-420}
t0=$(date +%s)
declare -a summary=()

# step NAME CAP_S CMD...: run CMD with at most CAP_S seconds (less if the deadline is nearer);
# skipped when under 20 s remain.
step() {
    local name=$1 cap=$2; shift 2
    if [[ " ${GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
        summary+=("$(printf '%-14s skipped (GPU_CHECK_SKIP)' "$name")"); return
    fi
    local left=$(( budget - ($(date +%s) - t0) ))
    (( cap > left )) && cap=$left
    if (( cap < 20 )); then
        summary+=("$(printf '%-14s skipped (deadline)' "$name")"); return
    fi
    local s=$(date +%s)
    echo "=== $name (cap ${cap}s) $(date -u +%H:%M:%S)" >> "$log"
    timeout --kill-after=5 "$cap" "$@" >> "$log" 2>&1
    local rc=$?
    summary+=("$(printf '%-14s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - s ))")")
}

{
    echo "=== machine"
    nvidia-smi -L; nvcc --version | tail -2
    "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
} >> "$log" 2>&1

export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# _C first on its own: the lookup-trie drafter of the GPU loop needs it even if nvcc fails.
step build_cpp 120 "$PY" setup.py build_ext --inplace
step build_cuda 150 env TREESPEC_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
    "$PY" setup.py build_ext --inplace
step tests 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_cuda_ops.py \
    tests/test_kernels_tree_attention.py tests/test_kernels_kv_compaction.py \
    tests/test_kernels_tree_accept.py tests/test_verify_device.py
if [ -d "$carry" ]; then
    step gpu_loop 100 "$PY" benchmarks/gpu_loop.py --model "$carry/code-lm" \
        --trie "$carry/code-lm-distill-5gram.trie" --prompts "$carry/prompts.json" \
        --dtype bfloat16 --out "$out"
else
    summary+=("gpu_loop       skipped (no $carry: run benchmarks/gpu_carry.py here first)")
fi
step compile_check 40 "$PY" -m vllm_treespec.kernels.compile_check --arch 90
step bench_kernels 160 "$PY" benchmarks/bench_kernels.py --batches 1 8 32 \
    --contexts 1024 4096 16384 --trees 16 64 --flex-contexts 4096 --budget-s 90 \
    --tune-s "${GPU_CHECK_TUNE_S:-30}" \
    --out "$out/bench_kernels.json"
step forward_costs 90 "$PY" benchmarks/gpu_forward_costs.py --budget-s 70 --out "$out"
step memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_ops.py

echo "=== summary $(( $(date +%s) - t0 ))s" | tee -a "$log"
printf '%s\n' "${summary[@]}" | tee -a "$log"
grep -E "passed|failed|error" "$log" | grep -E "^[0-9]+ (passed|failed)|ERROR|FAILED" | tail -8
tail -n 60 "$log" | grep -vE "^=== " | tail -n 40
