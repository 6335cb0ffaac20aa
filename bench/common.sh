# Shared set-up of the bench scripts (sourced): paths, overridable by env.
#   KILN_SHARED_BENCH  default <repo>/../shared/bench
#   KILN_BENCH_TMP     default /tmp/kiln-bench
#   KILN               default <repo>/build/kiln
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo=$(cd "$here/.." && pwd)
shared=${KILN_SHARED_BENCH:-$(cd "$here/../../shared/bench" && pwd)}
tmp=${KILN_BENCH_TMP:-/tmp/kiln-bench}
kiln=${KILN:-$repo/build/kiln}
py=/usr/bin/python3
