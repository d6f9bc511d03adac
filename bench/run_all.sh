#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The default benchmark run behind `./build.sh bench`:
#   1. moeroute-capacity on synthetic batches sized like a Mixtral 8x7B layer (E=8, k=2) and a
#      DeepSeek-V3 layer (E=256, k=8, 8 groups / top-4): table, CSV, JSON and a plot per model,
#      plus one combined plot;
#   2. the Google Benchmark CPU reference stages (JSON), and the CPU backend beside them;
#   3. expert parallelism: dispatch + combine over MPI for Mixtral- and DeepSeek-V3-sized layers
#      at R = 2 and 4 beside the raw MPI_Alltoallv of the same bytes, and the capacity tool's
#      cluster mode (--ep 64) on the same synthetic traffic;
#   4. capacity planning (--batch-tokens) on the real served traffic of tests/data/real-router
#      and on a synthetic 1M-token x 32-layer x 128-expert dump, with plots;
#   5. the GPU benchmarks, when bench_kernels_cuda was built and a device is present.
# Outputs go to $MOEROUTE_BENCH_OUT (default: build/bench/ in the source tree).
#
#   bench/run_all.sh BUILD_DIR        e.g. bench/run_all.sh build/release
set -euo pipefail
BUILD=${1:?usage: bench/run_all.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${MOEROUTE_BENCH_OUT:-$ROOT/build/bench}
TOOL="$BUILD/tools/capacity/moeroute-capacity"
KERNELS="$BUILD/bench/bench_kernels"
mkdir -p "$OUT"

log() { printf '\n==> %s\n' "$*"; }
for bin in "$TOOL" "$KERNELS"; do
  [ -x "$bin" ] || { echo "run_all.sh: $bin not built (configure with MOEROUTE_BUILD_BENCHMARKS=ON)" >&2; exit 1; }
done

# A python3 with matplotlib for the combined plot (Debian's first; pyenv shims often lack it).
PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c "import matplotlib" 2>/dev/null; then PY=$p; break; fi
done
PLOT_ARGS=()
[ -n "$PY" ] && PLOT_ARGS=(--python "$PY")

SCENARIOS=uniform,zipf,collapsed,homogeneous,mixed
FACTORS=0.5,0.75,1.0,1.25,1.5,2.0,dropless

sweep() {  # name preset tokens priorities policies repeats
  local name=$1 preset=$2 tokens=$3 prios=$4 pols=$5 reps=$6
  log "capacity sweep: $name (preset $preset, T=$tokens)"
  local plot=()
  [ -n "$PY" ] && plot=(--plot "$OUT/capacity_$name.png")
  "$TOOL" --preset "$preset" --scenario "$SCENARIOS" --tokens "$tokens" --factors "$FACTORS" \
          --priorities "$prios" --policies "$pols" --repeat "$reps" \
          --format table --out "$OUT/capacity_$name.txt" \
          --csv "$OUT/capacity_$name.csv" --json "$OUT/capacity_$name.json" \
          "${PLOT_ARGS[@]}" "${plot[@]}"
  cat "$OUT/capacity_$name.txt"
}

start=$(date +%s)
# Mixtral-sized layer: cheap, so every priority mode and every rerouting policy.
sweep mixtral mixtral 4096 token_major,choice_major,score zero_weight,fallback,next_choice 3
# DeepSeek-V3-sized layer: 256 experts, group-limited (next_choice is not defined with groups).
sweep deepseek_v3 deepseek_v3 4096 token_major,score zero_weight,fallback 1

if [ -n "$PY" ]; then
  log "combined plot"
  "$PY" "$ROOT/tools/capacity/scripts/plot_capacity.py" "$OUT/capacity.png" "$OUT/capacity_mixtral.csv" "$OUT/capacity_deepseek_v3.csv"
  echo "wrote $OUT/capacity.png"
else
  echo "no python3 with matplotlib: plots skipped (Debian: apt-get install python3-matplotlib)" >&2
fi

# Capacity planning (--batch-tokens): the real served traffic of tests/data/real-router, then a
# synthetic dump of MOEROUTE_PLAN_TOKENS tokens x 32 layers x 128 experts (float16, memory-
# mapped; 8 GiB at the default 1M tokens, deleted afterwards unless MOEROUTE_KEEP_TRAFFIC=1):
# 7 factors x 3 priorities, batches of 8192, timed end to end.
log "capacity plan: real served traffic (4 layers x 32768 tokens x 16 experts), batches of 2048"
plan_plot=()
[ -n "$PY" ] && plan_plot=(--plot "$OUT/plan_real.png")
"$TOOL" --npy "$ROOT/tests/data/real-router/traffic.npy" --batch-tokens 2048 --preset mixtral \
        --factors 1.0,1.25,1.5,2.0,2.5,3.0,dropless --priorities preset --policies zero_weight \
        --quiet --out "$OUT/plan_real.txt" --json "$OUT/plan_real.json" "${PLOT_ARGS[@]}" "${plan_plot[@]}"
cat "$OUT/plan_real.txt"
PLAN_TOKENS=${MOEROUTE_PLAN_TOKENS:-1048576}
if [ -n "$PY" ] && "$PY" -c "import numpy" 2>/dev/null; then
  log "capacity plan: synthetic traffic, $PLAN_TOKENS tokens x 32 layers x 128 experts (float16)"
  "$PY" "$ROOT/bench/make_traffic.py" "$OUT/traffic" --tokens "$PLAN_TOKENS"
  plan_plot=(--plot "$OUT/plan_synthetic.png")
  plan_start=$(date +%s)
  "$TOOL" --npy "$OUT/traffic/traffic.npy" --batch-tokens 8192 --preset qwen_moe \
          --factors 0.75,1.0,1.25,1.5,2.0,3.0,dropless --priorities token_major,choice_major,score \
          --policies zero_weight --out "$OUT/plan_synthetic.txt" --json "$OUT/plan_synthetic.json" \
          "${PLOT_ARGS[@]}" "${plan_plot[@]}"
  tail -45 "$OUT/plan_synthetic.txt"
  echo "planning run: $(( $(date +%s) - plan_start )) s wall for $PLAN_TOKENS tokens x 32 layers x 128 experts, 21 configs"
  [ "${MOEROUTE_KEEP_TRAFFIC:-0}" = 1 ] || rm -f "$OUT/traffic/traffic.npy"
else
  echo "no python3 with numpy: the synthetic planning run is skipped" >&2
fi

log "CPU reference stages (Google Benchmark)"
"$KERNELS" --benchmark_out="$OUT/kernels_cpu.json" --benchmark_out_format=json

CPU_BENCH="$BUILD/bench/bench_cpu"
if [ -x "$CPU_BENCH" ]; then
  log "CPU backend beside the reference and a memcpy (Google Benchmark)"
  "$CPU_BENCH" --benchmark_out="$OUT/cpu_backend.json" --benchmark_out_format=json
fi
if [ -n "$PY" ] && "$PY" -c "import torch" 2>/dev/null; then
  log "CPU backend vs the PyTorch baseline of Megatron-Core's router (same logits, same run)"
  "$PY" "$ROOT/bench/compare_torch.py" "$BUILD" --json "$OUT/cpu_vs_torch.json"
  if [ -d "$BUILD/python/moeroute" ]; then
    log "the Python package (moeroute.torch) vs torch ops, one thread"
    PYTHONPATH="$BUILD/python" "$PY" "$ROOT/bench/bench_python.py" --json "$OUT/python_vs_torch.json"
    log "a decode step's calls from Python (T = 1)"
    PYTHONPATH="$BUILD/python" "$PY" "$ROOT/bench/bench_python_decode.py" --json "$OUT/python_decode.json"
  fi
else
  echo "no python3 with torch: the PyTorch comparison is skipped (apt-get install python3-torch)" >&2
fi

EP_BENCH="$BUILD/bench/bench_ep_mpi"
if [ -x "$EP_BENCH" ] && command -v mpiexec >/dev/null 2>&1; then
  MPI_FLAGS=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && MPI_FLAGS+=(--allow-run-as-root)
  for R in 2 4; do
    log "expert parallelism over MPI, R=$R (dispatch + combine vs raw MPI_Alltoallv)"
    mpiexec -n "$R" "${MPI_FLAGS[@]}" "$EP_BENCH" --benchmark_out="$OUT/ep_mpi_R$R.json" \
      --benchmark_out_format=json | tee "$OUT/ep_mpi_R$R.txt"
  done
fi
log "capacity tool, cluster mode: 64 ranks, DeepSeek-V3-sized traffic"
ep_plot=()
[ -n "$PY" ] && ep_plot=(--plot "$OUT/ep_deepseek_v3_R64.png")
"$TOOL" --ep 64 --preset deepseek_v3 --scenario uniform,zipf --tokens 16384 --factors 1.0,1.25 \
        --placement round-robin --quiet --out "$OUT/ep_deepseek_v3_R64.txt" \
        --json "$OUT/ep_deepseek_v3_R64.json" "${PLOT_ARGS[@]}" "${ep_plot[@]}"
cat "$OUT/ep_deepseek_v3_R64.txt"

EP_CUDA_BENCH="$BUILD/bench/bench_ep_cuda"
if [ -x "$EP_CUDA_BENCH" ]; then
  log "GPU expert-parallel launchers, one-GPU loopback (registers nothing without a device)"
  "$EP_CUDA_BENCH" --benchmark_out="$OUT/ep_gpu.json" --benchmark_out_format=json || \
    echo "bench_ep_cuda failed (rc $?)" >&2
fi
CUDA_BENCH="$BUILD/bench/bench_kernels_cuda"
if [ -x "$CUDA_BENCH" ]; then
  log "GPU launchers (Google Benchmark, CUDA events)"
  # registers no case without a device; still writes a (empty) JSON
  "$CUDA_BENCH" --benchmark_out="$OUT/kernels_gpu.json" --benchmark_out_format=json || \
    echo "bench_kernels_cuda failed (rc $?)" >&2
fi

log "done in $(( $(date +%s) - start )) s; results in $OUT"
ls -1 "$OUT"/capacity* "$OUT"/plan_* "$OUT"/kernels_*.json "$OUT"/ep_* 2>/dev/null || true
