#!/usr/bin/env bash
# Packs the GPU check's binaries, built here, into one folder that runs on a GPU machine without
# our Debian packages (`./build.sh gpu-bundle [DIR]` builds them first):
#   DIR/bin  cuda_tests, the CUDA examples, bench_kernels_cuda, bench_ep_cuda, ep_nccl_tests
#            (stripped; CUDA runtime linked statically, sm_90 code)
#   DIR/lib  every shared library they load that is not part of the C runtime or the driver
#            (Google Benchmark, fmt, libstdc++, libgcc_s), plus this machine's C runtime and
#            loader in DIR/lib/libc, used only where the GPU machine's own is older (gpu_check.sh)
#   DIR/resources  the gating kernels' cubin and ptxas report (bench/kernel_resources.py)
#   DIR/MANIFEST  commit, date, compiler, architectures, and each file's sha256
# NCCL and cuBLAS (one example's) are not packed (200 and 600 MB): gpu_check.sh finds the GPU
# machine's own (its CUDA toolkit or its Python packages).
# With BASELINE_BUILD (`./build.sh gpu-bundle --baseline REV`), that build's bench_kernels_cuda
# goes in as DIR/bin/bench_kernels_cuda_baseline and MANIFEST names its commit (the build's
# BASELINE_COMMIT file, which build.sh writes): gpu-bench times
# the old kernels beside the new on the same card.
# Usage: tests/gpu_bundle.sh BUILD_DIR DIR [BASELINE_BUILD]
set -euo pipefail
BUILD=${1:?usage: tests/gpu_bundle.sh BUILD_DIR DIR [BASELINE_BUILD]}
DIR=${2:?usage: tests/gpu_bundle.sh BUILD_DIR DIR [BASELINE_BUILD]}
BASELINE=${3:-}
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BINS=(tests/cuda_tests tests/ep_nccl_tests bench/bench_kernels_cuda bench/bench_ep_cuda
      examples/example_cuda_gating examples/example_cuda_dispatch examples/example_switch_top1
      examples/example_mixtral_dropless examples/example_deepseek_v3 examples/example_ep_nccl)

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib/libc"
for b in "${BINS[@]}"; do
  if [ -x "$BUILD/$b" ]; then
    strip -o "$DIR/bin/$(basename "$b")" "$BUILD/$b"
  else
    echo "gpu_bundle: $BUILD/$b not built (skipped)" >&2
  fi
done
if [ -n "$BASELINE" ]; then
  strip -o "$DIR/bin/bench_kernels_cuda_baseline" "$BASELINE/bench/bench_kernels_cuda"
fi
mkdir -p "$DIR/resources"
cp "$BUILD"/tests/resources/routing_kernels.* "$DIR/resources/" 2>/dev/null ||
  echo "gpu_bundle: no kernel resource report in $BUILD/tests/resources (skipped)" >&2

# The C runtime (libc, libm, the loader...) and the driver (libcuda, libnccl) come from the GPU
# machine; everything else is copied beside the binaries.
is_system() {
  case "$(basename "$1")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux*.so* | libcuda.so* | \
      libnccl.so* | libcublas*.so* | linux-vdso*) return 0 ;;
  esac
  return 1
}
for b in "$DIR"/bin/*; do
  ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\// {print $1}'
done | sort -u | while read -r lib; do
  [ -f "$lib" ] || continue
  if is_system "$lib"; then
    case "$(basename "$lib")" in libcuda.so* | libnccl.so* | libcublas*.so*) continue ;; esac
    cp -L "$lib" "$DIR/lib/libc/"
  else
    cp -L "$lib" "$DIR/lib/"
  fi
done

{
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (work tree differs)')"
  [ -z "$BASELINE" ] || echo "baseline $(cat "$BASELINE/BASELINE_COMMIT" 2>/dev/null || echo unknown)"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvcc $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cuda_architectures $(grep -E '^CMAKE_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "glibc $(ldd --version | head -n 1 | awk '{print $NF}')"
  (cd "$DIR" && find bin lib resources -type f | sort | xargs sha256sum)
} >"$DIR/MANIFEST"
echo "gpu_bundle: $(du -sh "$DIR" | cut -f1) in $DIR"
