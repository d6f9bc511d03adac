#!/usr/bin/env bash
# The clang stage of `./build.sh test` (docs/reliability.md, "Compilers"): the CPU backend's
# tests built by clang — cpu_tests (every tests/cpu suite at the default ISA, SSE2 on x86-64)
# and cpu_native_tests (the ISA-dependent suites with -march=native) — and run. CI's release
# build (GCC) builds cpu_native_tests in full and leaves cpu_tests to this stage
# (MOEROUTE_TEST_BASELINE=OFF): each compiler builds one ISA of everything, in the time one
# compiler took for both. clang rejected or miscompiled code GCC took three times (2026-12:
# aligned moves through under-aligned vector references, the address of a vector element),
# and users' engines are often built with it.
# Environment: MOEROUTE_SKIP_CLANG=1 skips the stage.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
log() { printf '\n==> %s\n' "$*"; }
[ "${MOEROUTE_SKIP_CLANG:-0}" = "1" ] && { log "clang stage skipped (MOEROUTE_SKIP_CLANG=1)"; exit 0; }

start=$(date +%s)
log "configure (clang: the CPU backend's tests, Release)"
cmake --preset clang >/dev/null
# (cpu_native_tests exists where the compiler takes -march=native)
targets="cpu_tests"
help=$(cmake --build --preset clang --target help)
if grep -q '^\.\.\. cpu_native_tests$' <<<"$help"; then targets="$targets cpu_native_tests"; fi
log "build (clang, $JOBS jobs): $targets"
# shellcheck disable=SC2086
cmake --build --preset clang -j "$JOBS" --target $targets
log "tests (clang)"
ctest --preset clang -j "$JOBS" --no-tests=error
log "clang stage passed in $(($(date +%s) - start)) s"
