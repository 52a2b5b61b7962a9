#!/usr/bin/env bash
# GPU check for an H100/H200 box, under 5 minutes: environment, `roofline check` in bf16 (both
# backends), the GPU-marked tests, measured ceilings, a short sweep with its report, the kernel
# benchmark against cuBLAS / SDPA (its MET/MISS lines), and a short table of phase verdicts printed last.
#
#   scripts/gpu_check.sh                  # results in gpu-check-out/
#   OUT=/tmp/gc scripts/gpu_check.sh
#
# Nothing here changes clocks, power limits or modes. Every step runs even if an earlier one
# fails (except the sweep, which refuses to time kernels that failed their check); the exit
# status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
export ROOFLINE_CACHE_DIR=${ROOFLINE_CACHE_DIR:-$OUT/cache}
RUN=${ROOFLINE:-roofline}
SUMMARY=()
FAILED=0

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log, record status
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name: $*" >&2
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
    exit 2
fi

step env      30  $RUN env
step check    120 $RUN check --backend triton --dtype bf16
step check-pt 60  $RUN check --backend torch --dtype bf16
step tests    120 python -m pytest -q -m gpu tests/
step ceilings 60  $RUN ceilings --remeasure
step profile  150 $RUN profile --quick --out "$OUT" --csv --quiet
step bench    90  python benchmarks/kernel_speed.py --quick

cat "$OUT/env.log" | head -n 12
echo
cat "$OUT/ceilings.log"
echo
grep -E "MET|MISS|peer" "$OUT/bench.log" | head -n 30
echo
echo "step       status  time"
printf '%s\n' "${SUMMARY[@]}"
echo
# the short table last: the phase verdicts `roofline profile` printed
cat "$OUT/profile.log"
exit $FAILED
