#!/bin/bash
# Builds the libFuzzer harnesses of tests/fuzz (clang, ASan + UBSan, in
# build-fuzz/) and runs each for a fixed number of executions on a copy of
# its seed corpus (tests/fuzz/corpus/<target>/, left unchanged).
# usage: tests/fuzz/run_fuzz.sh [RUNS [TARGET...]]   (RUNS default 200000)
# Prints executions and findings per target. A finding's input lands in
# build-fuzz/findings/<target>/ (crash-*, leak-*, timeout-*, oom-*): add it
# to the corpus with the fix, where CTest replays it in every build. Slow
# inputs (slow-unit-*) are kept there too but not counted as findings.
# Exit status: 0 when no target found anything, 1 otherwise, 2 for a
# build that failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-200000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(record manifest byte_size escape shard jpeg source_list sources_tsv reject_log)
dir=build-fuzz
jobs=${KILN_FUZZ_JOBS:-$(nproc)}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DKILN_FUZZ=ON -DKILN_BUILD_TESTS=OFF -DKILN_WITH_TORCH=OFF -DKILN_WITH_PYTHON=OFF \
  >/dev/null || exit 2
cmake --build "$dir" -j "$jobs" --target "${targets[@]/#/fuzz_}" || exit 2
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
found=0
printf '%-12s %12s %9s  %s\n' target executions findings corpus
for t in "${targets[@]}"; do
  work=$dir/corpus/$t
  findings=$dir/findings/$t
  rm -rf "$work" "$findings"
  mkdir -p "$work" "$findings"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  log=$dir/fuzz_$t.log
  "$dir/tests/fuzz/fuzz_$t" -runs="$runs" -print_final_stats=1 -artifact_prefix="$findings/" \
    "$work" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  n=$(find "$findings" -type f ! -name 'slow-unit-*' | wc -l)
  if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then n="exit $rc"; fi
  printf '%-12s %12s %9s  %s\n' "$t" "${execs:-?}" "$n" "$(ls "$work" | wc -l) inputs"
  if [ "$n" != 0 ]; then
    found=1
    echo "  see $log and $findings/" >&2
  fi
  # An input that ran over 10 s once (-report_slow_units) is kept, but on
  # a busy machine that is not a failure: time it again to be sure.
  slow=$(find "$findings" -name 'slow-unit-*' | wc -l)
  [ "$slow" -eq 0 ] || echo "  $slow slow input(s) in $findings/ (not counted)" >&2
done
exit $found
