#!/usr/bin/env bash
# GPU check, called by `./build.sh gpu-check DIR` on a machine with a GPU (sized for one H200,
# 8 minutes in all):
#   1. configure + build Release for sm_90 in build/gpu-check (cuda_tests, the CUDA examples
#      and bench_kernels_cuda)
#   2. cuda_tests, the full GPU test binary except [soak] and [scale]; then "[scale]" (skipped,
#      exit 77, without ~12 GB of free device memory) and "[soak]" with MOEROUTE_SOAK_SECONDS;
#      ep_nccl_tests, the expert-parallel layer over real NCCL (one rank per GPU)
#   3. cuda_tests "[quick]" under compute-sanitizer memcheck, racecheck and initcheck
#   4. the CUDA examples (each checks itself against the CPU reference)
#   5. bench_ep_cuda (expert-parallel launchers on the one-GPU loopback) and bench_kernels_cuda,
#      the GPU kernel benchmarks (JSON in DIR)
# and writes one log per step plus DIR/summary.json.
#
# The [quick] tag: GPU test cases small enough to run under compute-sanitizer (each tool runs
# the whole [quick] set in well under two minutes). Any GPU test author who wants a case
# sanitized tags it [quick]; larger grids stay untagged and run in step 2 only.
#
# Environment: GPU_CHECK_BUDGET (seconds, default 470) caps the whole run; each step gets
# min(its own timeout, what is left). GPU_CHECK_DRY_RUN=1 configures only and records every
# other step as skipped (for checking the script on a machine without a GPU).
set -uo pipefail

OUT=${1:?usage: tests/gpu_check.sh DIR}
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD="$ROOT/build/gpu-check"
JOBS=$(nproc 2>/dev/null || echo 4)
BUDGET=${GPU_CHECK_BUDGET:-470}
DRY=${GPU_CHECK_DRY_RUN:-0}
START=$(date +%s)
export PATH="/usr/local/cuda/bin:$PATH"
# The test binaries bake in the data directory of the tree they were built from; binaries
# built elsewhere and carried here read this tree's copy instead.
export MOEROUTE_GOLDEN_DIR=${MOEROUTE_GOLDEN_DIR:-$ROOT/tests/data/golden}
export MOEROUTE_GOLDEN_GRAD_DIR=${MOEROUTE_GOLDEN_GRAD_DIR:-$ROOT/tests/data/golden-grad}
export MOEROUTE_GOLDEN_HF_DIR=${MOEROUTE_GOLDEN_HF_DIR:-$ROOT/tests/data/golden-hf}

STEPS_JSON=""
FAILED=0

json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\n\r'; }

record() {  # name rc seconds status log note
  local entry
  entry=$(printf '{"name":"%s","rc":%s,"seconds":%s,"status":"%s","log":"%s","note":"%s"}' \
    "$1" "$2" "$3" "$4" "$(json_escape "$5")" "$(json_escape "$6")")
  STEPS_JSON="${STEPS_JSON:+$STEPS_JSON,}$entry"
  printf '==> %-22s %-8s rc=%-4s %4ss  %s\n' "$1" "$4" "$2" "$3" "$6"
}

# run_step NAME TIMEOUT CMD...  (runs CMD with a timeout bounded by the budget left)
run_step() {
  local name=$1 limit=$2
  shift 2
  local log="$OUT/$name.log"
  local left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 20)); then
    record "$name" -1 0 skipped "$log" "budget exhausted"
    return 0
  fi
  ((limit > left)) && limit=$left
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  local st=passed note
  note=$(grep -E "test cases|All tests passed|ERROR SUMMARY|Error:|error:" "$log" | tail -n 1)
  if ((rc == 124 || rc == 137)); then
    st=timeout
    note="timed out after ${limit}s"
  elif ((rc == 77)); then
    st=skipped
    note="no CUDA device"
  elif ((rc != 0)); then
    st=failed
  fi
  [ "$st" = failed ] || [ "$st" = timeout ] && FAILED=1
  record "$name" "$rc" "$dt" "$st" "$log" "$note"
  return $rc
}

skip_step() { record "$1" -1 0 skipped "" "$2"; }

DEVICE="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  DEVICE=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
  nvidia-smi >"$OUT/nvidia-smi.log" 2>&1 || true
fi

# 1. configure and build
run_step configure 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DMOEROUTE_ENABLE_CUDA=ON -DMOEROUTE_BUILD_TESTS=ON \
  -DMOEROUTE_BUILD_BENCHMARKS=ON -DMOEROUTE_BUILD_EXAMPLES=ON
CONFIGURED=$?

EXAMPLES=(example_cuda_gating example_cuda_dispatch example_switch_top1 example_mixtral_dropless
          example_deepseek_v3)
TARGETS=(cuda_tests "${EXAMPLES[@]}")
HELP=""
((CONFIGURED == 0)) && HELP=$(cmake --build "$BUILD" --target help 2>/dev/null)
# targets that exist only with their dependency (Google Benchmark, NCCL)
grep -q "bench_kernels_cuda" <<<"$HELP" && TARGETS+=(bench_kernels_cuda bench_ep_cuda)
if grep -q "ep_nccl_tests" <<<"$HELP"; then
  TARGETS+=(ep_nccl_tests example_ep_nccl)
  EXAMPLES+=(example_ep_nccl)
fi

if [ "$DRY" = 1 ]; then
  skip_step build "dry run (targets: ${TARGETS[*]})"
  for s in cuda_tests ep_nccl_tests scale soak memcheck racecheck initcheck examples bench_kernels_cuda; do skip_step "$s" "dry run"; done
else
  if ((CONFIGURED == 0)); then
    run_step build 300 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
    BUILT=$?
  else
    skip_step build "configure failed"
    BUILT=1
  fi
  TESTS="$BUILD/tests/cuda_tests"
  if ((BUILT == 0)) && [ -x "$TESTS" ]; then
    # 2. the full GPU test binary
    run_step cuda_tests 150 "$TESTS" "~[soak]~[scale]" --durations yes
    run_step scale 60 "$TESTS" "[scale]"
    # 3. the [quick] set under each compute-sanitizer tool
    if command -v compute-sanitizer >/dev/null 2>&1; then
      run_step memcheck 120 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
        "$TESTS" "[quick]"
      run_step racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 1 "$TESTS" "[quick]"
      run_step initcheck 120 compute-sanitizer --tool initcheck --error-exitcode 1 "$TESTS" "[quick]"
    else
      for s in memcheck racecheck initcheck; do skip_step "$s" "compute-sanitizer not found"; done
      FAILED=1
    fi
    # 2b. expert parallelism over real NCCL: one rank per GPU (1-rank smoke test on one GPU)
    if [ -x "$BUILD/tests/ep_nccl_tests" ]; then
      run_step ep_nccl_tests 60 "$BUILD/tests/ep_nccl_tests"
    else
      skip_step ep_nccl_tests "not built (no NCCL)"
    fi
    # 3b. the randomized GPU-vs-CPU soak loop, bounded by MOEROUTE_SOAK_SECONDS. It runs after
    # the sanitizers so that a tight budget cuts the soak, not the correctness checks.
    run_step soak 60 env MOEROUTE_SOAK_SECONDS="${MOEROUTE_SOAK_SECONDS:-30}" "$TESTS" "[soak]"
  else
    for s in cuda_tests scale soak memcheck racecheck initcheck; do skip_step "$s" "not built"; done
  fi
  # 4. the CUDA examples
  for ex in "${EXAMPLES[@]}"; do
    if [ -x "$BUILD/examples/$ex" ]; then
      run_step "$ex" 30 "$BUILD/examples/$ex"
    else
      skip_step "$ex" "not built"
    fi
  done
  # 5. GPU benchmarks
  if [ -x "$BUILD/bench/bench_ep_cuda" ]; then
    run_step bench_ep_cuda 60 "$BUILD/bench/bench_ep_cuda" \
      --benchmark_out="$OUT/bench_ep_cuda.json" --benchmark_out_format=json
  fi
  BENCH="$BUILD/bench/bench_kernels_cuda"
  if [ -x "$BENCH" ]; then
    run_step bench_kernels_cuda 120 "$BENCH" --benchmark_min_time=0.05 \
      --benchmark_out="$OUT/bench_kernels_cuda.json" --benchmark_out_format=json
  else
    skip_step bench_kernels_cuda "no bench_kernels_cuda binary"
  fi
fi

TOTAL=$(($(date +%s) - START))
ALL=true
((FAILED)) && ALL=false
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
printf '{"date":"%s","commit":"%s","device":"%s","dry_run":%s,"total_seconds":%s,"all_passed":%s,"steps":[%s]}\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$COMMIT" "$(json_escape "$DEVICE")" \
  "$([ "$DRY" = 1 ] && echo true || echo false)" "$TOTAL" "$ALL" "$STEPS_JSON" >"$OUT/summary.json"
echo "gpu-check: summary in $OUT/summary.json (${TOTAL}s, all_passed=$ALL)"
((FAILED)) && exit 1
exit 0
