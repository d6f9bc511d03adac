#!/usr/bin/env bash
# moeroute build entry point. On a fresh Debian machine each command installs what is missing,
# configures through a CMake preset, builds with every core and runs.
#
#   ./build.sh test          build everything, run all tests (GPU tests skip without a device)
#   ./build.sh bench         build Release, run the capacity sweep and the kernel benchmarks
#   ./build.sh examples      build and run the examples
#   ./build.sh gpu-check DIR on a GPU machine: GPU tests, compute-sanitizer, GPU benchmarks
#                            (add --prebuilt BUNDLE to run binaries built elsewhere, no installs)
#   ./build.sh gpu-bench DIR [--prebuilt BUNDLE]  the short GPU loop (< 4 minutes): gating and
#                            gating-backward tests and benchmarks beside torch, kernel resources
#                            (GPU_BENCH_FOCUS=routing: dispatch, layout and the route instead)
#   ./build.sh gpu-bundle [DIR]  build the GPU check's binaries here and pack them for such a
#                            machine (default build/gpu-bundle)
#   ./build.sh python        `pip install .` into build/python-venv, then the Python tests on it
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

log() { printf '\n==> %s\n' "$*"; }

# Debian packages this project needs; installed only when missing.
PACKAGES=(cmake make g++ catch2 libfmt-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          python3 python3-numpy python3-matplotlib clang libclang-rt-dev clang-format
          libopenmpi-dev openmpi-bin
          python3-dev pybind11-dev python3-pytest python3-torch python3-pandas python3-venv
          python3-hypothesis libomp-dev)

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

# Without a device moeroute's own GPU binaries can only be compiled (their tests skip), so they
# are built as a compile check (MOEROUTE_GPU_COMPILE_CHECK, cmake/dev_cuda_binary.cmake).
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

configure_build() {  # $1 = preset, then extra cmake arguments
  local check=ON
  has_gpu && check=OFF
  log "configure ($1; GPU binaries as a compile check only: $check)"
  cmake --preset "$1" "-DMOEROUTE_GPU_COMPILE_CHECK=$check" "${@:2}" >/dev/null
  log "build ($1, $JOBS jobs)"
  cmake --build --preset "$1" -j "$JOBS"
}

# transformers for the HuggingFace tests (python/tests/test_hf.py): Debian has no package, so it
# comes from PyPI into build/hf-venv, which sees Debian's torch and numpy. 4.46.3 runs on
# Debian's torch 1.13 (4.51 needs torch >= 2). Without the network the tests are not registered.
hf_python() {
  local venv="$ROOT/build/hf-venv"
  if ! "$venv/bin/python" -c "import transformers" >/dev/null 2>&1; then
    log "transformers 4.46.3 into $venv (PyPI)" >&2
    rm -rf "$venv"  # (a venv that fails the import is a partial install: pip would keep it)
    if ! { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
           "$venv/bin/pip" install --quiet "transformers==4.46.3"; } >&2; then
      rm -rf "$venv"
      log "warning: no transformers (pip failed, its error above: no network? no disk space?): the HF tests are not registered" >&2
      return 0
    fi
  fi
  echo "$venv/bin/python"
}

# A second venv for what needs torch >= 2: torch.compile, torch's custom operators, and the
# transformers releases with Qwen3-MoE and DeepSeek-V2 / V3 (python/tests/test_hf.py,
# test_torch.py, test_router_modes.py). torch 2.5.1 from PyPI brings its CUDA libraries: ~3 GB
# downloaded, 5.2 GB on disk, about 70 s here. MOEROUTE_SKIP_TORCH2=1 (or no network): not
# registered.
hf_torch2_python() {
  [ "${MOEROUTE_SKIP_TORCH2:-0}" = "1" ] && return 0
  local venv="$ROOT/build/hf-torch2-venv"
  if ! "$venv/bin/python" -c "import torch, transformers, pytest" >/dev/null 2>&1; then
    log "torch 2.5.1 + transformers 4.57.6 into $venv (PyPI)" >&2
    # a venv that fails the import is a partial install (a full disk left torch without
    # torch.cuda, and pip then called the pinned version installed): start it afresh, and
    # remove what a failed install left
    rm -rf "$venv"
    if ! { /usr/bin/python3 -m venv "$venv" &&
           "$venv/bin/pip" install --quiet "torch==2.5.1" "transformers==4.57.6" numpy pytest; } >&2; then
      rm -rf "$venv"
      log "warning: no torch 2 venv (pip failed, its error above: no network? no disk space?): its tests are not registered" >&2
      return 0
    fi
  fi
  echo "$venv/bin/python"
}

cmd_test() {
  install_deps
  # cpu_tests (the default ISA) is tests/clang.sh's: GCC builds the -march=native ones here
  configure_build release "-DMOEROUTE_HF_PYTHON=$(hf_python)" \
    "-DMOEROUTE_TORCH2_PYTHON=$(hf_torch2_python)" -DMOEROUTE_TEST_BASELINE=OFF
  log "tests (release)"
  ctest --preset release -j "$JOBS" --timeout 1200
  if [ -x tests/clang.sh ]; then tests/clang.sh; fi
  if [ -x tests/sanitize.sh ]; then tests/sanitize.sh; fi
  if [ -x tests/tsan.sh ]; then tests/tsan.sh; fi
}

cmd_bench() {
  install_deps
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
  local out=${1:?usage: ./build.sh gpu-check DIR [--prebuilt BUNDLE]}
  # A prebuilt bundle runs as it is: the GPU machine may have none of our packages and no
  # network, so nothing is installed.
  [ "${2:-}" = --prebuilt ] || install_deps
  tests/gpu_check.sh "$@"
}

# The GPU check's binaries, built here for sm_90 and packed with the shared libraries they need
# (tests/gpu_bundle.sh), for a GPU machine without our packages: carry DIR there and run
# `./build.sh gpu-check OUT --prebuilt DIR`.
# gpu-bundle [DIR] [--baseline REV]: with --baseline, REV's bench_kernels_cuda goes into the
# bundle too (built from `git archive REV` in build/gpu-baseline), and gpu-bench times it beside
# the new kernels in the same run, on the same card.
cmd_gpu_bundle() {
  local dir=build/gpu-bundle build=build/gpu-prebuilt baseline=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --baseline) baseline=${2:?"--baseline REV"}; shift 2 ;;
      *) dir=$1; shift ;;
    esac
  done
  install_deps
  local cuda_args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
    -DMOEROUTE_ENABLE_CUDA=ON -DMOEROUTE_BUILD_TESTS=ON -DMOEROUTE_BUILD_BENCHMARKS=ON
    -DMOEROUTE_BUILD_EXAMPLES=ON -DMOEROUTE_BUILD_PYTHON=OFF -DMOEROUTE_ENABLE_MPI=OFF)
  log "configure ($build: Release, sm_90)"
  cmake -S . -B "$build" "${cuda_args[@]}" >/dev/null
  log "build the GPU check's binaries ($JOBS jobs)"
  cmake --build "$build" -j "$JOBS" --target cuda_tests bench_kernels_cuda bench_ep_cuda \
    ep_nccl_tests example_cuda_gating example_cuda_dispatch example_switch_top1 \
    example_mixtral_dropless example_deepseek_v3 example_ep_nccl routing_kernel_resources
  local base_build=""
  if [ -n "$baseline" ]; then
    local src=build/gpu-baseline/src rev
    rev=$(git rev-parse --verify "$baseline^{commit}") || { log "--baseline $baseline: no such commit"; exit 2; }
    log "baseline: bench_kernels_cuda of $rev ($src)"
    rm -rf "$src" && mkdir -p "$src" && git archive "$rev" | tar -x -C "$src"
    base_build=build/gpu-baseline/build
    cmake -S "$src" -B "$base_build" "${cuda_args[@]}" >/dev/null
    echo "$rev" >"$base_build/BASELINE_COMMIT"  # (tests/gpu_bundle.sh names it in MANIFEST)
    cmake --build "$base_build" -j "$JOBS" --target bench_kernels_cuda
  fi
  tests/gpu_bundle.sh "$build" "$dir" $base_build
}

# The Python package as a user installs it: `pip install .` (scikit-build-core and pybind11
# come from PyPI into pip's isolated build environment) into a virtual environment that sees
# Debian's torch and numpy, then the Python tests against the installed package.
cmd_python() {
  install_deps
  local py=/usr/bin/python3 venv="$ROOT/build/python-venv"
  log "pip install . into $venv"
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet "$ROOT"
  log "Python tests against the installed package"
  (cd "$ROOT/build" && MOEROUTE_SHARED_DATA="$ROOT/tests/data" \
     "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$ROOT/python/tests")
}

case "${1:-test}" in
  test) cmd_test ;;
  bench) cmd_bench ;;
  examples) cmd_examples ;;
  gpu-check) shift; cmd_gpu_check "$@" ;;
  gpu-bench) shift; GPU_CHECK_MODE=bench cmd_gpu_check "$@" ;;
  gpu-bundle) shift; cmd_gpu_bundle "$@" ;;
  python) cmd_python ;;
  *) echo "usage: $0 test|bench|examples|python|gpu-check DIR [--prebuilt BUNDLE]|gpu-bench DIR [--prebuilt BUNDLE]|gpu-bundle [DIR] [--baseline REV]" >&2; exit 2 ;;
esac
