#!/usr/bin/env bash
# GPU check, called by `./build.sh gpu-check DIR [--prebuilt BUNDLE]` on a machine with a GPU
# (sized for one H200, 8 minutes in all):
#   1. build: configure + build Release for sm_90 in build/gpu-check (cuda_tests, the CUDA
#      examples, bench_kernels_cuda, bench_ep_cuda, ep_nccl_tests), or with --prebuilt, take
#      the binaries from BUNDLE (made by `./build.sh gpu-bundle` on a machine with our packages,
#      for a GPU machine that has none) and check that each one loads
#   2. cuda_tests, the full GPU test binary except [soak] and [scale]
#   3. the CUDA examples (each checks itself against the CPU reference); ep_nccl_tests, the
#      expert-parallel layer over real NCCL (one rank per GPU)
#   4. bench_kernels_cuda (GPU kernel benchmarks, JSON in DIR) and the PyTorch baseline of the
#      same stages in the same run (bench/torch_gpu_baseline.py, where torch sees the GPU), with
#      a table of both (DIR/gpu_vs_torch.md); bench_ep_cuda (expert-parallel loopback)
#   5. cuda_tests "[quick]" under compute-sanitizer memcheck, racecheck, initcheck, synccheck
#   6. "[scale]" (skipped, exit 77, without ~12 GB of free device memory) and "[soak]" with
#      MOEROUTE_SOAK_SECONDS
# and writes one log per step plus DIR/summary.json, and all of it as DIR.tgz. Benchmarks run before the sanitizers so a
# tight budget cuts the slowest checks last, never the numbers.
#
# The [quick] tag: GPU test cases small enough to run under compute-sanitizer. Any GPU test
# author who wants a case sanitized tags it [quick]; larger grids stay untagged.
# compute-sanitizer refuses the device on some virtual machines ("Device not supported"): that
# step is then recorded as skipped, with the reason, not as a failure.
#
# GPU_CHECK_MODE=bench (`./build.sh gpu-bench`) runs the short loop of a GPU stay instead, under
# 4 minutes, so one lent machine can measure, change and measure again: the gating and
# gating-backward GPU tests ("[gating],[backward],[invariance]"), bench_kernels_cuda's gating
# cases, torch's routers beside them (eager, compiled, under graph replay) with the table, and
# the kernels' resource table (bench/kernel_resources.py, with nvdisasm's instruction classes).
# A bundle made with `--baseline REV` also holds REV's bench_kernels_cuda: its same cases run
# right after ours (DIR/bench_kernels_cuda_baseline.json), old and new on one card.
# GPU_BENCH_FOCUS=routing makes it the routing metadata's loop instead: the dispatch, layout and
# router GPU tests, bench_kernels_cuda's dispatch / layout / losses / route_graph cases, and
# torch's same stages (eager, compiled, the route under graph replay), and the router's tests
# and route_graph cases again with programmatic dependent launch on (MOEROUTE_CUDA_PDL=1).
#
# Environment: GPU_CHECK_BUDGET (seconds, default 470; 230 for bench) caps the whole run; each
# step gets min(its own timeout, what is left). GPU_CHECK_DRY_RUN=1 (for a machine without a GPU)
# configures only, or with --prebuilt checks that every binary loads; other steps are skipped.
set -uo pipefail

USAGE="usage: tests/gpu_check.sh DIR [--prebuilt BUNDLE]"
OUT=${1:?$USAGE}
PREBUILT=""
if [ $# -ge 2 ]; then
  [ "$2" = --prebuilt ] && [ -n "${3:-}" ] || { echo "$USAGE" >&2; exit 2; }
  PREBUILT=$(cd "$3" && pwd) || exit 2
fi
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD="$ROOT/build/gpu-check"
JOBS=$(nproc 2>/dev/null || echo 4)
MODE=${GPU_CHECK_MODE:-full}
case "$MODE" in
  full) BUDGET=${GPU_CHECK_BUDGET:-470} ;;
  bench) BUDGET=${GPU_CHECK_BUDGET:-230} ;;
  *) echo "GPU_CHECK_MODE must be full or bench, not '$MODE'" >&2; exit 2 ;;
esac
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
  elif ((rc != 0)) && grep -q "Device not supported" "$log"; then
    st=skipped  # compute-sanitizer refuses this (virtual) machine's device: not our failure
    note="compute-sanitizer: Device not supported on this machine"
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

EXAMPLES=(example_cuda_gating example_cuda_dispatch example_switch_top1 example_mixtral_dropless
          example_deepseek_v3)
RUN=()  # prefix for every binary: empty, or the bundle's own loader (see below)
if [ -z "$PREBUILT" ]; then
  # 1. configure and build
  BIN_TESTS="$BUILD/tests" BIN_BENCH="$BUILD/bench" BIN_EXAMPLES="$BUILD/examples"
  RESOURCES="$BUILD/tests/resources"
  run_step configure 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DMOEROUTE_ENABLE_CUDA=ON -DMOEROUTE_BUILD_TESTS=ON \
    -DMOEROUTE_BUILD_BENCHMARKS=ON -DMOEROUTE_BUILD_EXAMPLES=ON -DMOEROUTE_BUILD_PYTHON=OFF \
    -DMOEROUTE_ENABLE_MPI=OFF
  CONFIGURED=$?
  TARGETS=(cuda_tests "${EXAMPLES[@]}")
  [ "$MODE" = bench ] && TARGETS=(cuda_tests routing_kernel_resources)
  HELP=""
  ((CONFIGURED == 0)) && HELP=$(cmake --build "$BUILD" --target help 2>/dev/null)
  # targets that exist only with their dependency (Google Benchmark, NCCL)
  grep -q "bench_kernels_cuda" <<<"$HELP" && TARGETS+=(bench_kernels_cuda bench_ep_cuda)
  [ "$MODE" = full ] && grep -q "ep_nccl_tests" <<<"$HELP" && TARGETS+=(ep_nccl_tests example_ep_nccl)
  if [ "$DRY" = 1 ]; then
    skip_step build "dry run (targets: ${TARGETS[*]})"
  elif ((CONFIGURED == 0)); then
    run_step build 300 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
  else
    skip_step build "configure failed"
  fi
else
  # 1'. a prebuilt bundle: its own shared libraries first; NCCL and the driver from this machine
  BIN_TESTS="$PREBUILT/bin" BIN_BENCH="$PREBUILT/bin" BIN_EXAMPLES="$PREBUILT/bin"
  RESOURCES="$PREBUILT/resources"
  LIBS="$PREBUILT/lib"
  # libraries the bundle leaves to this machine, where its loader does not find them already
  for lib in libnccl.so.2 libcublas.so.13; do
    grep -q "$lib " <<<"$(ldconfig -p 2>/dev/null)" && continue  # (no pipe: pipefail + grep -q)
    dir=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr /opt -name "$lib" \
      -printf '%h\n' 2>/dev/null | head -n 1)
    [ -n "$dir" ] && LIBS="$LIBS:$dir"
  done
  export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Where this machine's C runtime is older than the one the bundle was linked against, run
  # every binary through the bundle's own loader and C runtime.
  if grep -q "GLIBC_[0-9.]*' not found" <<<"$("$PREBUILT/bin/cuda_tests" --help 2>&1)"; then
    RUN=("$PREBUILT/lib/libc/ld-linux-x86-64.so.2" --library-path "$PREBUILT/lib/libc:$LIBS")
  fi
  {
    cat "$PREBUILT/MANIFEST"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "loader: ${RUN[*]:-the system one}"
  } >"$OUT/bundle.log"
  # each binary starts (a missing library or symbol fails here, not in the middle of a step);
  # exit 77 is a start without a device
  load_check() {
    local b rc bad=""
    for b in "$PREBUILT"/bin/*; do
      case "$(basename "$b")" in
        cuda_tests) "${RUN[@]}" "$b" --help >/dev/null 2>>"$OUT/bundle.log" ;;
        bench_*) "${RUN[@]}" "$b" --benchmark_list_tests=true >/dev/null 2>>"$OUT/bundle.log" ;;
        *) LD_TRACE_LOADED_OBJECTS=1 "${RUN[@]}" "$b" >>"$OUT/bundle.log" 2>&1 ;;
      esac
      rc=$?
      ((rc == 0 || rc == 77)) || bad="$bad $(basename "$b")"
    done
    grep -q "not found" "$OUT/bundle.log" && bad="$bad (a library not found: bundle.log)"
    [ -z "$bad" ] || { echo "binaries that did not load:$bad"; return 1; }
    echo "every binary loads"
  }
  t0=$(date +%s)
  load_check >"$OUT/bundle_loads.log" 2>&1
  rc=$?
  st=passed
  ((rc)) && st=failed && FAILED=1
  record bundle_loads "$rc" $(($(date +%s) - t0)) "$st" "$OUT/bundle_loads.log" \
    "$(tail -n 1 "$OUT/bundle_loads.log")"
fi
BENCH="$BIN_BENCH/bench_kernels_cuda"
# run_bench NAME TIMEOUT ARGS...: bench_kernels_cuda, JSON into DIR/bench_kernels_cuda.json
# (BENCH_BINARY=bench_kernels_cuda_baseline: the bundle's baseline binary, JSON into
# DIR/bench_kernels_cuda_baseline.json)
run_bench() {
  local name=$1 limit=$2 binary=${BENCH_BINARY:-bench_kernels_cuda}
  shift 2
  if [ -x "$BIN_BENCH/$binary" ]; then
    run_step "$name" "$limit" "${RUN[@]}" "$BIN_BENCH/$binary" "$@" \
      --benchmark_min_time="${GPU_CHECK_BENCH_MIN_TIME:-0.02}" \
      --benchmark_out="$OUT/$binary.json" --benchmark_out_format=json
  else
    skip_step "$name" "no $binary binary"
  fi
}
# run_torch NAME TIMEOUT ARGS...: bench/torch_gpu_baseline.py in the same run, with the table
run_torch() {
  local name=$1 limit=$2
  shift 2
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    run_step "$name" "$limit" env PYTHONUNBUFFERED=1 python3 "$ROOT/bench/torch_gpu_baseline.py" \
      "$@" --out "$OUT/torch_gpu_baseline.jsonl" --ours "$OUT/bench_kernels_cuda.json" \
      --table "$OUT/gpu_vs_torch.md"
  else
    skip_step "$name" "no torch with CUDA"
  fi
}
# what the short loop measures: the gating kernels (default) or the routing metadata (dispatch,
# layout, the whole route under graph replay)
case "${GPU_BENCH_FOCUS:-gating}" in
  gating)
    FOCUS=gating FOCUS_TESTS="[gating],[backward],[invariance]" FOCUS_BENCH='^cuda_gating'
    FOCUS_TORCH=(--stages gating,gating_backward --tokens 1,16,128,16384
      --models switch_base,mixtral_8x7b,deepseek_v3,qwen3_moe,olmoe,deepseek_v3_e384,qwen3_e512_k10) ;;
  routing)
    FOCUS=routing FOCUS_TESTS="[dispatch],[layout],[router]"
    FOCUS_BENCH='^cuda_(dispatch|layout|route_graph|losses)'
    FOCUS_TORCH=(--stages losses,dispatch,layout,route_graph --tokens 1,16,128,4096,16384
      --models switch_base,mixtral_8x7b,deepseek_v3,qwen3_moe,olmoe) ;;
  *) echo "GPU_BENCH_FOCUS=$GPU_BENCH_FOCUS: gating or routing" >&2; exit 2 ;;
esac
if [ "$DRY" = 1 ] && [ "$MODE" = bench ]; then
  PDL_STEPS=()
  [ "$FOCUS" = routing ] && PDL_STEPS=(routing_tests_pdl bench_routing_pdl)
  for s in "${FOCUS}_tests" "bench_$FOCUS" "${PDL_STEPS[@]}" "torch_$FOCUS" kernel_resources; do
    skip_step "$s" "dry run"
  done
elif [ "$MODE" = bench ]; then
  TESTS="$BIN_TESTS/cuda_tests"
  if [ -x "$TESTS" ]; then
    run_step "${FOCUS}_tests" 90 "${RUN[@]}" "$TESTS" "$FOCUS_TESTS" --durations yes
  else
    skip_step "${FOCUS}_tests" "not built"
  fi
  run_bench "bench_$FOCUS" 60 --benchmark_filter="$FOCUS_BENCH"
  # a bundle made with --baseline REV: the old kernels' same cases, on the same card, now
  if [ -x "$BIN_BENCH/bench_kernels_cuda_baseline" ]; then
    BENCH_BINARY=bench_kernels_cuda_baseline run_bench "bench_${FOCUS}_baseline" 60 \
      --benchmark_filter="$FOCUS_BENCH"
  fi
  if [ "$FOCUS" = routing ] && [ -x "$BENCH" ] && [ -x "$TESTS" ]; then
    # programmatic dependent launch, off by default until measured (MOEROUTE_CUDA_PDL=1;
    # include/moeroute/cuda/launch.cuh): the router's tests and the route under graph replay
    # again with it on, beside the run above
    run_step routing_tests_pdl 60 env MOEROUTE_CUDA_PDL=1 "${RUN[@]}" "$TESTS" \
      "[router],[dispatch]" --durations yes
    run_step bench_routing_pdl 40 env MOEROUTE_CUDA_PDL=1 "${RUN[@]}" "$BENCH" \
      --benchmark_filter='^cuda_route_graph' \
      --benchmark_min_time="${GPU_CHECK_BENCH_MIN_TIME:-0.02}" \
      --benchmark_out="$OUT/bench_kernels_cuda_pdl.json" --benchmark_out_format=json
  fi
  run_torch "torch_$FOCUS" 120 "${FOCUS_TORCH[@]}" --compile --repeat 10
  # the kernels' resource table (registers, spills, SASS size) from the bundle
  if [ -f "$RESOURCES/routing_kernels.log" ]; then
    run_step kernel_resources 30 python3 "$ROOT/bench/kernel_resources.py" \
      "$RESOURCES/routing_kernels.log" "$RESOURCES/routing_kernels.cubin"
  else
    skip_step kernel_resources "no resource report (routing_kernel_resources not built)"
  fi
elif [ "$DRY" = 1 ]; then
  for s in cuda_tests examples ep_nccl_tests bench_kernels_cuda torch_baseline bench_ep_cuda \
    memcheck racecheck initcheck synccheck scale soak; do skip_step "$s" "dry run"; done
else
  TESTS="$BIN_TESTS/cuda_tests"
  have() { [ -x "$1" ]; }
  # 2. the full GPU test binary
  if have "$TESTS"; then
    run_step cuda_tests 150 "${RUN[@]}" "$TESTS" "~[soak]~[scale]" --durations yes
  else
    skip_step cuda_tests "not built"
  fi
  # 3. the CUDA examples; expert parallelism over real NCCL (1-rank smoke test on one GPU)
  have "$BIN_EXAMPLES/example_ep_nccl" && EXAMPLES+=(example_ep_nccl)
  for ex in "${EXAMPLES[@]}"; do
    if have "$BIN_EXAMPLES/$ex"; then
      run_step "$ex" 30 "${RUN[@]}" "$BIN_EXAMPLES/$ex"
    else
      skip_step "$ex" "not built"
    fi
  done
  if have "$BIN_TESTS/ep_nccl_tests"; then
    run_step ep_nccl_tests 60 "${RUN[@]}" "$BIN_TESTS/ep_nccl_tests"
  else
    skip_step ep_nccl_tests "not built (no NCCL)"
  fi
  # 4. GPU benchmarks and the PyTorch baseline of the same stages, in the same run
  run_bench bench_kernels_cuda 150
  run_torch torch_baseline 150
  if have "$BIN_BENCH/bench_ep_cuda"; then
    run_step bench_ep_cuda 60 "${RUN[@]}" "$BIN_BENCH/bench_ep_cuda" \
      --benchmark_min_time="${GPU_CHECK_BENCH_MIN_TIME:-0.02}" \
      --benchmark_out="$OUT/bench_ep_cuda.json" --benchmark_out_format=json
  fi
  # 5. the [quick] set under each compute-sanitizer tool
  if have "$TESTS" && command -v compute-sanitizer >/dev/null 2>&1; then
    run_step memcheck 120 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
      "${RUN[@]}" "$TESTS" "[quick]"
    for tool in racecheck initcheck synccheck; do
      run_step "$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 1 "${RUN[@]}" "$TESTS" "[quick]"
    done
  else
    for s in memcheck racecheck initcheck synccheck; do
      skip_step "$s" "compute-sanitizer or cuda_tests not found"
    done
    FAILED=1
  fi
  # 6. large shapes, then the randomized GPU-vs-CPU soak loop bounded by MOEROUTE_SOAK_SECONDS
  if have "$TESTS"; then
    run_step scale 60 "${RUN[@]}" "$TESTS" "[scale]"
    run_step soak 60 env MOEROUTE_SOAK_SECONDS="${MOEROUTE_SOAK_SECONDS:-30}" "${RUN[@]}" "$TESTS" "[soak]"
  fi
fi

TOTAL=$(($(date +%s) - START))
ALL=true
((FAILED)) && ALL=false
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
# a bundle's binaries are what ran: its commit (the tree's .git may be absent or older there)
[ -n "$PREBUILT" ] && COMMIT=$(awk '/^commit /{print substr($2, 1, 7) ($3 ? " " $3 " " $4 " " $5 : ""); exit}' "$PREBUILT/MANIFEST")
printf '{"date":"%s","commit":"%s","device":"%s","dry_run":%s,"total_seconds":%s,"all_passed":%s,"steps":[%s]}\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$COMMIT" "$(json_escape "$DEVICE")" \
  "$([ "$DRY" = 1 ] && echo true || echo false)" "$TOTAL" "$ALL" "$STEPS_JSON" >"$OUT/summary.json"
# every log in one file beside DIR (a device runner may bring back only a few files)
tar czf "$OUT.tgz" -C "$OUT" . 2>/dev/null || true
echo "gpu-check: summary in $OUT/summary.json, every log in $OUT.tgz (${TOTAL}s, all_passed=$ALL)"
((FAILED)) && exit 1
exit 0
