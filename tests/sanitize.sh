#!/usr/bin/env bash
# Reliability stages of `./build.sh test` (docs/reliability.md):
#   1. the `asan` preset: every CPU test built with AddressSanitizer + UndefinedBehaviorSanitizer
#      (-fno-sanitize-recover=all, so the first error fails the run), run with ctest — except
#      cpu_tests, cpu_native_tests and cpu_avx2_tests, to keep CI within its time: the CPU
#      backend runs under ASan + UBSan in stage 2 (fuzz_cpu: the whole backend against the
#      reference on fuzzed inputs and the corpus);
#   2. tests/fuzz/fuzz.sh: the libFuzzer targets, each for a bounded time from the seed corpus.
# Environment: MOEROUTE_SKIP_FUZZ=1 skips stage 2; MOEROUTE_FUZZ_SECONDS (default 45) bounds it.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
log() { printf '\n==> %s\n' "$*"; }

start=$(date +%s)
log "configure (asan: ASan + UBSan, CPU only)"
cmake --preset asan >/dev/null
# Only what the CPU tests run: the test binaries (*_tests) and the capacity tool; no benchmarks,
# no header-check objects. ctest --preset asan runs the tests labelled cpu or tool.
targets=$(cmake --build --preset asan --target help | sed -n 's/^\.\.\. \([A-Za-z0-9_]*\).*/\1/p' |
          grep -E '^([a-z0-9_]+_tests|moeroute_capacity)$' | grep -v -E '^(cuda_tests|cpu_tests|cpu_native_tests|cpu_avx2_tests)$' |
          sort -u | tr '\n' ' ')
log "build (asan, $JOBS jobs): $targets"
# shellcheck disable=SC2086
cmake --build --preset asan -j "$JOBS" --target $targets
log "tests (asan)"
ctest --preset asan -j "$JOBS"
log "sanitizer stage passed in $(($(date +%s) - start)) s"

if [ "${MOEROUTE_SKIP_FUZZ:-0}" != "1" ]; then
  tests/fuzz/fuzz.sh
fi
