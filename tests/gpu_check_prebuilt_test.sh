#!/usr/bin/env bash
# CI check of gpu_check.sh's run-only path (--prebuilt) on a machine without a GPU: a stand-in
# bundle whose cuda_tests behaves as the real one does without a device (exit 77, and 0 for
# --help). Checked: the load check passes for binaries that start and fails for one that does
# not, the dry run skips every other step, summary.json records the bundle's commit, and bad
# arguments exit 2. (The real bundle is built by `./build.sh gpu-bundle`; docs/gpu-results.md.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "gpu_check_prebuilt_test: $*" >&2
  exit 1
}

bundle="$work/bundle"
mkdir -p "$bundle/bin" "$bundle/lib/libc"
cat >"$bundle/bin/cuda_tests" <<'EOF'
#!/bin/sh
[ "${1:-}" = --help ] && exit 0
echo "moeroute GPU tests: no CUDA device — skipping"
exit 77
EOF
printf '#!/bin/sh\nexit 0\n' >"$bundle/bin/example_cuda_gating"
chmod +x "$bundle"/bin/*
printf 'commit 0123456789abcdef0123456789abcdef01234567\ndate now\n' >"$bundle/MANIFEST"

# 1. dry run: the load check passes, everything else is skipped, the commit is the bundle's
out="$work/out"
GPU_CHECK_DRY_RUN=1 tests/gpu_check.sh "$out" --prebuilt "$bundle" >"$work/log" 2>&1 ||
  fail "dry run exited $? (log: $(cat "$work/log"))"
s="$out/summary.json"
[ -f "$s" ] || fail "no summary.json"
grep -q '"name":"bundle_loads","rc":0,"seconds":[0-9]*,"status":"passed"' "$s" ||
  fail "bundle_loads not passed: $(cat "$s")"
grep -q '"name":"cuda_tests","rc":-1,"seconds":0,"status":"skipped"' "$s" ||
  fail "cuda_tests not skipped in a dry run: $(cat "$s")"
grep -q '"commit":"0123456"' "$s" || fail "summary does not carry the bundle's commit: $(cat "$s")"
grep -q '"dry_run":true' "$s" || fail "dry_run not recorded"
grep -q '"all_passed":true' "$s" || fail "a dry run with loading binaries must pass"
# (listed to a file: grep -q in a pipe may close it early, and pipefail then fails the tar)
tar tzf "$out.tgz" >"$work/listing" 2>&1 || fail "no readable $out.tgz"
grep -q summary.json "$work/listing" || fail "$out.tgz holds no summary.json"

# 1b. the short loop (GPU_CHECK_MODE=bench, `./build.sh gpu-bench`) in a dry run: its own steps
GPU_CHECK_MODE=bench GPU_CHECK_DRY_RUN=1 tests/gpu_check.sh "$work/outb" --prebuilt "$bundle" \
  >"$work/log" 2>&1 || fail "bench dry run exited $? (log: $(cat "$work/log"))"
s="$work/outb/summary.json"
for step in gating_tests bench_gating torch_gating kernel_resources; do
  grep -q "\"name\":\"$step\",\"rc\":-1,\"seconds\":0,\"status\":\"skipped\"" "$s" ||
    fail "bench mode lacks the skipped step $step: $(cat "$s")"
done
grep -q '"name":"memcheck"' "$s" && fail "bench mode ran a full-check step: $(cat "$s")"
# ... and its routing focus (GPU_BENCH_FOCUS=routing) its own; an unknown focus exits 2
GPU_CHECK_MODE=bench GPU_BENCH_FOCUS=routing GPU_CHECK_DRY_RUN=1 tests/gpu_check.sh "$work/outr" \
  --prebuilt "$bundle" >"$work/log" 2>&1 || fail "routing dry run exited $? (log: $(cat "$work/log"))"
s="$work/outr/summary.json"
for step in routing_tests bench_routing routing_tests_pdl bench_routing_pdl torch_routing \
  kernel_resources; do
  grep -q "\"name\":\"$step\",\"rc\":-1,\"seconds\":0,\"status\":\"skipped\"" "$s" ||
    fail "the routing focus lacks the skipped step $step: $(cat "$s")"
done
GPU_CHECK_MODE=bench GPU_BENCH_FOCUS=speed GPU_CHECK_DRY_RUN=1 tests/gpu_check.sh "$work/outf" \
  --prebuilt "$bundle" >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown GPU_BENCH_FOCUS must exit 2"
GPU_CHECK_MODE=fast tests/gpu_check.sh "$work/outc" --prebuilt "$bundle" >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown GPU_CHECK_MODE must exit 2"

# 2. a test binary that cannot start (as with a missing library: exit 127) fails the load
# check and the run
printf '#!/bin/sh\nexit 127\n' >"$bundle/bin/cuda_tests"
GPU_CHECK_DRY_RUN=1 tests/gpu_check.sh "$work/out2" --prebuilt "$bundle" >"$work/log" 2>&1 &&
  fail "a binary that does not start passed the load check"
grep -q "did not load: cuda_tests" "$work/out2/bundle_loads.log" ||
  fail "the load check does not name the binary: $(cat "$work/out2/bundle_loads.log")"

# 3. bad arguments
tests/gpu_check.sh "$work/out3" --prebuilt >/dev/null 2>&1
[ $? -eq 2 ] || fail "--prebuilt without a folder must exit 2"
tests/gpu_check.sh "$work/out3" --bundle "$bundle" >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown option must exit 2"
echo "gpu_check_prebuilt_test: passed"
