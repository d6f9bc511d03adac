#!/usr/bin/env bash
# Bounded libFuzzer run of every target in tests/fuzz (docs/reliability.md):
#   configure + build the `fuzz` preset (clang++, -fsanitize=fuzzer,address,undefined), then run
#   each target for MOEROUTE_FUZZ_SECONDS (default 45) from its seed corpus
#   tests/fuzz/corpus/<target>/ (read-only here; new inputs go to build/fuzz/corpus/<target>/).
#   The targets run side by side (one per core). A crash, leak, timeout or violated invariant
#   is written to tests/fuzz/crashes/<target>-<hash> and fails the script; keep that file as a
#   regression seed by moving it into the corpus once fixed.
# MOEROUTE_FUZZ_SECONDS=0 only replays the corpus.
#   tests/fuzz/fuzz.sh --long   each target for an hour (MOEROUTE_FUZZ_SECONDS overrides), for
#                               a person who wants more than CI's bounded run; the corpus grown
#                               in build/fuzz/corpus/ is kept, so the next run starts from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
if [ "${1:-}" = "--long" ]; then
  SECS=${MOEROUTE_FUZZ_SECONDS:-3600}
else
  SECS=${MOEROUTE_FUZZ_SECONDS:-45}
fi
JOBS=$(nproc 2>/dev/null || echo 2)
BUILD="$ROOT/build/fuzz"
CRASH_DIR="$ROOT/tests/fuzz/crashes"
log() { printf '\n==> %s\n' "$*"; }

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz.sh: clang++ not found (install clang and libclang-rt-dev)" >&2
  exit 1
fi

start=$(date +%s)
log "configure (fuzz: clang libFuzzer + ASan + UBSan)"
cmake --preset fuzz >/dev/null
log "build (fuzz, $JOBS jobs)"
cmake --build --preset fuzz -j "$JOBS"

declare -A MAX_LEN=([fuzz_route]=4096 [fuzz_npy]=4096)
mkdir -p "$CRASH_DIR"
pids=()
names=()
for exe in "$BUILD"/tests/fuzz/fuzz_*; do
  [ -x "$exe" ] && [ -f "$exe" ] || continue
  name=$(basename "$exe")
  seeds="$ROOT/tests/fuzz/corpus/$name"
  # fuzz_cpu decodes the same inputs as fuzz_route: it starts from that corpus
  [ "$name" = fuzz_cpu ] && seeds="$ROOT/tests/fuzz/corpus/fuzz_route"
  work="$BUILD/corpus/$name"
  mkdir -p "$seeds" "$work"
  args=(-max_len="${MAX_LEN[$name]:-4096}" -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$CRASH_DIR/$name-" -print_final_stats=1)
  if [ "$SECS" -gt 0 ]; then args+=(-max_total_time="$SECS"); else args+=(-runs=0); fi
  log "fuzz $name for ${SECS} s (seeds: tests/fuzz/corpus/$name, $(ls "$seeds" | wc -l) files)"
  "$exe" "${args[@]}" "$work" "$seeds" >"$BUILD/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
done
if ((${#pids[@]} == 0)); then
  echo "fuzz.sh: no fuzz targets were built" >&2
  exit 1
fi

fail=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "${names[$i]}: $(grep -E '^Done' "$BUILD/${names[$i]}.log" | tail -1)," \
         "corpus $(ls "$BUILD/corpus/${names[$i]}" | wc -l) inputs"
  else
    echo "fuzz.sh: ${names[$i]} FAILED; its log ($BUILD/${names[$i]}.log) ends:" >&2
    tail -40 "$BUILD/${names[$i]}.log" >&2
    fail=1
  fi
done
if ((fail)); then
  echo "fuzz.sh: crashing inputs are in tests/fuzz/crashes/:" >&2
  ls -l "$CRASH_DIR" >&2
  exit 1
fi
log "fuzz stage passed in $(($(date +%s) - start)) s"
