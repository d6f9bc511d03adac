#!/usr/bin/env bash
# CPU emulation of the GPU dispatch path (no GPU needed): rewrites the launchers' <<<>>> launches
# into loops over blocks and threads, replaces CUB's device sort and scan by std::stable_sort
# and a serial scan, and checks dispatch, layouts, permute and combine against the CPU
# reference on ~3900 cases (every policy, all golden cases), in forward and reverse thread order.
# Needs g++, python3 and the CUDA toolkit's host headers and libcudart. Not a substitute for
# running cuda_tests on a GPU: it checks the algorithm, not CUB, concurrency or the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CUDA=${CUDA_HOME:-/usr/local/cuda}
WORK=${1:-$ROOT/build/emulation}
mkdir -p "$WORK/inc/moeroute/cuda"
python3 tests/emulation/transform.py include/moeroute/cuda "$WORK/inc/moeroute/cuda" \
  dispatch.cuh layout.cuh permute.cuh combine.cuh
g++ -std=c++20 -O1 -ffp-contract=off -w -I"$WORK/inc" -Itests/emulation/inc -Iinclude -Ikernels \
  -Itests/cuda -I"$CUDA/include" tests/emulation/driver.cpp -o "$WORK/dispatch_emulation" \
  -L"$CUDA/lib64" -lcudart
export LD_LIBRARY_PATH="$CUDA/lib64:${LD_LIBRARY_PATH:-}"
"$WORK/dispatch_emulation" tests/data/golden
"$WORK/dispatch_emulation" tests/data/golden reverse
