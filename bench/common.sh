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

# corpus DIR N: the benchmark corpus of N images in DIR, made once and reused.
corpus() {
  local d=$1 m=$2
  if [ ! -d "$d" ]; then
    echo "# making corpus of $m images in $d ..." >&2
    rm -rf "$d.tmp"
    "$shared/make_dev_corpus.sh" "$d.tmp" "$m" >&2
    mv "$d.tmp" "$d"
  fi
}

# bench_cache SRC DIR LOG: the 3x224x224 float16 cache of SRC in DIR, reused
# only when it quick-verifies (one left by an older kiln or a killed build is
# rebuilt); kiln build's output goes to LOG.
bench_cache() {
  local s=$1 c=$2 log=$3
  if ! "$kiln" verify "$c" --level quick >/dev/null 2>&1; then
    echo "# building cache $c ..." >&2
    rm -rf "$c"
    "$kiln" build "$s" "$c" --resize 256 --crop 224 --dtype float16 --norm imagenet \
        --threads 2 --progress none >"$log" 2>&1
  fi
}
