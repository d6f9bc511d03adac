#!/usr/bin/env bash
# Lock-step CPU emulation of the gating, loss and backward kernels (no GPU needed; see
# README.md): every CUDA thread is a fiber, __syncthreads and warp shuffles are real barriers.
#   run_lockstep.sh WORK_DIR DRIVER.cpp [driver args...]
# Rewrites the launchers and kernel headers (transform.py --lockstep), compiles the driver with
# g++ against them, and runs it twice: threads in forward order, then in reverse order.
# Needs g++, python3 and the CUDA toolkit's host headers and libcudart.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CUDA=${CUDA_HOME:-/usr/local/cuda}
WORK=$1
DRIVER=$2
shift 2
NAME=$(basename "$DRIVER" .cpp)
mkdir -p "$WORK/inc/moeroute/cuda" "$WORK/inc/moeroute/kernels"
python3 tests/emulation/transform.py --lockstep include/moeroute/cuda "$WORK/inc/moeroute/cuda" \
  gating.cuh losses.cuh backward.cuh
python3 tests/emulation/transform.py --lockstep kernels/moeroute/kernels "$WORK/inc/moeroute/kernels" \
  gating.cuh losses.cuh backward.cuh
g++ -std=c++20 -O1 -ffp-contract=off -w -I"$WORK/inc" -Itests/emulation/inc -Iinclude -Ikernels \
  -Itests/cuda -I"$CUDA/include" -DMOEROUTE_TEST_DATA_DIR="\"$ROOT/tests/data\"" \
  "$DRIVER" -o "$WORK/$NAME" -L"$CUDA/lib64" -lcudart
export LD_LIBRARY_PATH="$CUDA/lib64:${LD_LIBRARY_PATH:-}"
"$WORK/$NAME" "$@"
EMU_REVERSE=1 "$WORK/$NAME" "$@"
