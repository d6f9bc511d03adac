#!/usr/bin/env bash
# moeroute build entry point. On a fresh Debian machine each command installs what is missing,
# configures through a CMake preset, builds with every core and runs.
#
#   ./build.sh test          build everything, run all tests (GPU tests skip without a device)
#   ./build.sh bench         build Release, run the capacity sweep and the kernel benchmarks
#   ./build.sh examples      build and run the examples
#   ./build.sh gpu-check DIR on a GPU machine: GPU tests, compute-sanitizer, GPU benchmarks
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

log() { printf '\n==> %s\n' "$*"; }

# Debian packages this project needs; installed only when missing.
PACKAGES=(cmake make g++ catch2 libfmt-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          python3 python3-numpy python3-matplotlib clang libclang-rt-dev clang-format
          libopenmpi-dev openmpi-bin)
# Only `./build.sh bench` needs these: the PyTorch baseline of the CPU backend benchmark.
BENCH_PACKAGES=(python3-torch)

install_deps() {  # [extra packages...]
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # nvcc is optional: the CUDA target and GPU tests are built whenever it is found.
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

configure_build() {  # $1 = preset
  log "configure ($1)"
  cmake --preset "$1" >/dev/null
  log "build ($1, $JOBS jobs)"
  cmake --build --preset "$1" -j "$JOBS"
}

cmd_test() {
  install_deps
  configure_build release
  log "tests (release)"
  ctest --preset release -j "$JOBS" --timeout 1200
  if [ -x tests/sanitize.sh ]; then tests/sanitize.sh; fi
}

cmd_bench() {
  install_deps "${BENCH_PACKAGES[@]}"
  configure_build release
  if [ -x bench/run_all.sh ]; then
    bench/run_all.sh "$ROOT/build/release"
  else
    log "no benchmarks yet"
  fi
}

cmd_examples() {
  install_deps
  configure_build release
  for ex in build/release/examples/example_*; do
    [ -x "$ex" ] || continue
    log "$(basename "$ex")"
    "$ex"
  done
}

cmd_gpu_check() {
  local out=${1:?usage: ./build.sh gpu-check DIR}
  install_deps
  if [ -x tests/gpu_check.sh ]; then
    tests/gpu_check.sh "$out"
  else
    echo "gpu-check: tests/gpu_check.sh missing" >&2
    exit 1
  fi
}

case "${1:-test}" in
  test) cmd_test ;;
  bench) cmd_bench ;;
  examples) cmd_examples ;;
  gpu-check) shift; cmd_gpu_check "$@" ;;
  *) echo "usage: $0 test|bench|examples|gpu-check DIR" >&2; exit 2 ;;
esac
