#!/bin/bash
# Builds kiln with sanitizers and runs the test suite under them.
# usage: tools/sanitize.sh [asan|tsan]   (default asan)
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer, every CTest test
#         that is C++, in build-asan/. Left out: python.* (the Python and
#         pip tests load the extension into an uninstrumented interpreter)
#         and install.* (it builds a consumer of the installed libraries
#         without the sanitizer's flags, which cannot link them)
#   tsan  ThreadSanitizer over the same tests, in build-tsan/ (those that
#         kill kiln build or fill a small filesystem included: the killed
#         and the failing processes are instrumented like the rest)
# Both build without LibTorch (KILN_WITH_TORCH=OFF): Debian's LibTorch is
# not instrumented. Exit status: that of ctest (0 = clean).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-asan}
case $mode in
  asan) flags="address,undefined" ;;
  tsan) flags="thread" ;;
  *) echo "usage: $0 [asan|tsan]" >&2; exit 2 ;;
esac
dir=build-$mode
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE="$flags" \
  -DKILN_WITH_TORCH=OFF -DKILN_WITH_PYTHON=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# TSan: second_deadlock_stack for readable reports; oneTBB is not instrumented,
# so its own synchronization is not seen - reports from inside TBB are suppressed.
export TSAN_OPTIONS="second_deadlock_stack=1:halt_on_error=1:suppressions=$PWD/tools/tsan.supp"
cd "$dir"
ctest --output-on-failure -j "$(nproc)" -E '^python\.|^install\.'

