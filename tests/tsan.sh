#!/usr/bin/env bash
# The ThreadSanitizer stage of `./build.sh test` (docs/reliability.md, "Threads"):
#   1. the `tsan` preset (clang, -fsanitize=thread, LLVM's OpenMP with its Archer tool, which
#      tells TSan what OpenMP's barriers and task hand-offs order): concurrency_tests (the CPU
#      backend from several caller threads over one shared config, OpenMP teams inside each,
#      one caller thread pool shared by several callers) and ep_tests (every EP scenario on
#      the loopback transport, one std::thread per rank);
#   2. a canary: a deliberate race through cpu::parallel_for under OpenMP, built the same way,
#      must be reported — the stage fails if TSan stops seeing the backend's threads;
#   3. the `tsan-python` preset: the Python module built by GCC with -fsanitize=thread and no
#      OpenMP (GCC's libgomp is not instrumented), loaded into Debian's python3 with
#      LD_PRELOAD=libtsan, running python/tests/test_threads.py (stages from several Python
#      threads, a shared Config assigned meanwhile, the planner and agreement).
# Environment: MOEROUTE_SKIP_TSAN=1 skips the stage.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)
log() { printf '\n==> %s\n' "$*"; }
[ "${MOEROUTE_SKIP_TSAN:-0}" = "1" ] && { log "TSan stage skipped (MOEROUTE_SKIP_TSAN=1)"; exit 0; }

start=$(date +%s)
llvm_lib="$(dirname "$(readlink -f "$(command -v clang++)")")/../lib"
archer="$llvm_lib/libarcher.so"
if [ ! -f "$archer" ]; then
  echo "tsan.sh: $archer not found (install libomp-dev): OpenMP would be unchecked" >&2
  exit 1
fi
export OMP_TOOL_LIBRARIES="$archer"
# TSan's options for the canary and the Python run: the tsan test preset's, which ctest sets
# for the C++ tests (one place to change them). ignore_noninstrumented_modules: libomp's own
# memory is not ours to check (Archer supplies the ordering its synchronisation gives).
TSAN=$(/usr/bin/python3 -c 'import json, sys
presets = json.load(open(sys.argv[1]))["testPresets"]
print(next(p for p in presets if p["name"] == "tsan")["environment"]["TSAN_OPTIONS"])' \
  "$ROOT/CMakePresets.json")

log "configure (tsan: clang ThreadSanitizer, LLVM OpenMP + Archer)"
cmake --preset tsan >/dev/null
log "build (tsan, $JOBS jobs): concurrency_tests ep_tests"
cmake --build --preset tsan -j "$JOBS" --target concurrency_tests ep_tests
log "tests (tsan)"
ctest --preset tsan -j "$JOBS" --no-tests=error

log "canary: a deliberate race must be reported"
canary="$ROOT/build/tsan/tsan_canary"
clang++ -std=c++20 -fsanitize=thread -fopenmp -O1 -g -I "$ROOT/include" \
  "$ROOT/tests/threads/tsan_canary.cpp" -o "$canary"
if TSAN_OPTIONS="$TSAN" "$canary" >"$canary.log" 2>&1 || ! grep -q "ThreadSanitizer: data race" "$canary.log"; then
  echo "tsan.sh: the canary's race was not reported; TSan does not see OpenMP threads:" >&2
  cat "$canary.log" >&2
  exit 1
fi
echo "reported, as it must be"

log "configure (tsan-python: the module, GCC ThreadSanitizer, no OpenMP)"
cmake --preset tsan-python >/dev/null
log "build (tsan-python, $JOBS jobs)"
cmake --build --preset tsan-python -j "$JOBS" --target moeroute_python
libtsan=$(g++ -print-file-name=libtsan.so)
log "Python threads under TSan ($libtsan)"
# -s: a report halts the process, and pytest's capture would swallow it
(cd "$ROOT/build" && LD_PRELOAD="$(readlink -f "$libtsan")" TSAN_OPTIONS="$TSAN" \
   PYTHONPATH="$ROOT/build/tsan-python/python" MOEROUTE_SHARED_DATA="$ROOT/tests/data" \
   /usr/bin/python3 -m pytest -q -s -p no:cacheprovider "$ROOT/python/tests/test_threads.py")
log "TSan stage passed in $(($(date +%s) - start)) s"
