#!/usr/bin/env bash
# GPU check for an A100/H100/H200 box, in at most 8 minutes: the compile check first (every kernel
# variant for sm_80 and sm_90: compile errors, shared memory, registers, spills, grids), then
# environment, `roofline check` in bf16 (both backends), the GPU-marked timing tests, measured
# ceilings, a short sweep with its report, and the kernel benchmark against cuBLAS / SDPA. It prints
# MET/MISS against the targets last:
#   Triton linear >= 0.9x cuBLAS at M >= 1024, and >= 85% of measured HBM bandwidth at M <= 16;
#   decode attention >= 85% of measured copy bandwidth at batch x context >= 32 x 4096;
#   prefill attention >= 0.8x SDPA (flash);
#   int8 / int4 weight-only decode linears >= 80% of measured HBM bandwidth counting their int bytes.
# A short quantized sweep (bf16, int8, int4, fp8 per channel and in 128x128 blocks, nvfp4 weights; bf16 and fp8
# KV cache) and its diagnosis measure what quantization does to decode (`roofline check` above runs the fp8 and
# FP4 kernels' rows: W8A8 GEMMs, fp8 experts, act quant, FP4 linears and experts, the fp8 KV cache); gpt-oss-20b
# runs at its release's precision (MXFP4 experts).
#
#   scripts/gpu_check.sh                  # results in gpu-check-out/
#   OUT=/tmp/gc BUDGET_S=300 scripts/gpu_check.sh
#
# Nothing here changes clocks, power limits or modes. Every step runs even if an earlier one
# fails (except the sweep, which refuses to time kernels that failed their check); a step that
# no longer fits the budget is skipped and said so. The exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
export ROOFLINE_CACHE_DIR=${ROOFLINE_CACHE_DIR:-$OUT/cache}
RUN=${ROOFLINE:-roofline}
BUDGET_S=${BUDGET_S:-480}          # the whole script (8 minutes); each step is cut to what is left, in order
SUMMARY=()
FAILED=0
T_START=$SECONDS

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log, record status
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET_S - (SECONDS - T_START)))
    if [ "$left" -lt 10 ]; then
        SUMMARY+=("$(printf '%-10s SKIP     0s  (the %ss budget is spent)' "$name" "$BUDGET_S")")
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$SECONDS
    echo "== $name (<= ${limit}s): $*" >&2
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local dt=$((SECONDS - t0))
    if [ $rc -eq 0 ]; then SUMMARY+=("$(printf '%-10s ok    %4ss' "$name" "$dt")")
    else
        FAILED=1
        SUMMARY+=("$(printf '%-10s FAIL  %4ss  (rc %s, see %s)' "$name" "$dt" "$rc" "$OUT/$name.log")")
        tail -n 20 "$OUT/$name.log" >&2
    fi
}

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU is visible to torch; nothing to check here." >&2
    echo "gpu_check: the compile check needs no GPU: roofline check --compile --quick" >&2
    exit 2
fi

# in order of what a first GPU run most needs to learn; a step the budget no longer fits is skipped
step compile  90  $RUN check --compile --quick
step env      15  $RUN env
step check    75  $RUN check --backend triton --dtype bf16
step ceilings 40  $RUN ceilings --remeasure
step profile  80  $RUN profile --quick --out "$OUT" --csv --quiet
step bench    70  python benchmarks/kernel_speed.py --quick
step tests    50  python -m pytest -q -m gpu tests/test_profiler_timing.py tests/test_kernels_gpu.py -k "bf16 or cuda or runners"
step check-pt 30  $RUN check --backend torch --dtype bf16
step quant    90  $RUN profile --quick --phases decode --weight-dtype bf16,int8,int4,fp8,fp8-block,nvfp4 \
    --kv-dtype bf16,fp8 --out "$OUT/quant" --quiet --no-report
# a model released quantized, at its own precision (the preset carries gpt-oss's MXFP4 experts): the fused MoE's
# FP4 path and the bf16 attention, random weights of the real sizes
step mxfp4    60  $RUN profile --model gpt-oss-20b --phases decode --batches 1,16 --contexts 1024 --backends triton \
    --out "$OUT/mxfp4" --quiet --no-report
step qdiag    15  $RUN diagnose "$OUT/quant/results.jsonl"
# tensor parallelism needs a GPU per rank: NCCL over 2 GPUs when the box has them
if python -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)"; then
    step tp-logits 60 python -c "from profiler.tp_check import tp_logits_check; from roofline.models import load_model; \
r = tp_logits_check(2, load_model('small'), device='cuda'); print(r); \
assert all(e <= 1e-4 * s for e, s in r.values()), r"
    step tp-coll  60  python benchmarks/collective_speed.py --tp 2
    step tp-prof  90  $RUN profile --tp 2 --quick --out "$OUT/tp2" --quiet --no-report
else
    SUMMARY+=("$(printf '%-10s SKIP     0s  (one GPU: NCCL needs a GPU per rank)' "tp")")
fi
# --counters: Nsight Compute on a decode sweep of our triton kernels, only where ncu exists (issue 25); the
# q_proj b1 line checks the counters against the model: its DRAM bytes should be about 1.0x the weight bytes
if command -v ncu >/dev/null 2>&1; then
    step counters 120 $RUN profile --counters --model llama-3-8b --phases decode --batches 1,16 --contexts 1024 \
        --backends triton --out "$OUT/counters" --no-report
    step cdiag    15  $RUN diagnose "$OUT/counters/results.jsonl"
else
    SUMMARY+=("$(printf '%-10s SKIP     0s  (no ncu on PATH: Nsight Compute not installed)' "counters")")
fi

head -n 12 "$OUT/env.log" 2>/dev/null
echo
grep -E "^(FAIL|warn|WARNING)|assembled by|^compile check" "$OUT/compile.log" 2>/dev/null | head -n 20
echo
cat "$OUT/ceilings.log" 2>/dev/null
echo
echo "step       status  time"
printf '%s\n' "${SUMMARY[@]}"
echo "total $((SECONDS - T_START))s of a ${BUDGET_S}s budget"
echo
# the short tables last: the phase verdicts `roofline profile` printed, what quantization did, then the targets
cat "$OUT/profile.log" 2>/dev/null
echo
grep -E "measured in this file|dequantization-bound" "$OUT/qdiag.log" 2>/dev/null | head -n 8
echo
echo "targets (benchmarks/kernel_speed.py, measured ceilings):"
grep -E "MET|MISS" "$OUT/bench.log" 2>/dev/null | head -n 30 || echo "  (no benchmark output: see $OUT/bench.log)"
exit $FAILED
