#!/bin/bash
# kiln build against another kiln binary (an older commit's), same corpus, same options,
# interleaved in one run: has a change made the build slower?
# usage: bench/build_regression.sh OTHER_KILN [N=4000] [ROUNDS=3] [-- BUILD OPTIONS...]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Build options default to the bench cache's: --resize 256 --crop 224 --dtype float16
# --norm imagenet. Each round builds the corpus (warm) with each binary, --threads 2
# --force, and prints both build times (kiln build's own "in X ms"); then this/other over
# all rounds (goal <= 1.05: within 5%) and whether the two caches' shards are identical.
# To get an older binary: git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B
# /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF
# -DKILN_WITH_PYTHON=OFF && ninja -C /tmp/old/build kiln.
# A benchmark, not a test: exits 0 whatever the figures (2 when a build fails).
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
other=${1:?usage: bench/build_regression.sh OTHER_KILN [N] [ROUNDS] [-- OPTIONS...]}
shift
n=4000; rounds=3
[ $# -gt 0 ] && [ "$1" != "--" ] && { n=$1; shift; }
[ $# -gt 0 ] && [ "$1" != "--" ] && { rounds=$1; shift; }
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
opts=("$@")
[ ${#opts[@]} -gt 0 ] || opts=(--resize 256 --crop 224 --dtype float16 --norm imagenet)
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
[ -x "$other" ] || { echo "no kiln binary at $other" >&2; exit 2; }
src=$tmp/corpus-$n
corpus "$src" "$n"
cat "$src"/*/* >/dev/null
ms() { sed -n 's/.* in \([0-9.]*\) \(ms\|s\) .*/\1 \2/p' | head -1 | awk '{print ($2 == "s") ? $1 * 1000 : $1}'; }
tt=0; to=0
echo "== build_regression: N=$n, $rounds rounds, ${opts[*]} --threads 2, load $(cut -d' ' -f1 /proc/loadavg)"
echo "   this:  $kiln"
echo "   other: $other"
for r in $(seq 1 "$rounds"); do
  # Alternate which goes first: the second build of a round finds the first's freed pages.
  for who in $( [ $((r % 2)) -eq 1 ] && echo "this other" || echo "other this"); do
    bin=$kiln; [ "$who" = other ] && bin=$other
    t=$("$bin" build "$src" "$tmp/regress-$who-$n" "${opts[@]}" --threads 2 --force \
        --progress none 2>&1 | ms) || exit 2
    [ -n "$t" ] || { echo "could not parse a build time" >&2; exit 2; }
    eval "t_$who=$t"
  done
  echo "round $r: this ${t_this} ms, other ${t_other} ms, this/other = $(echo "$t_this / $t_other" | bc -l | xargs printf %.3f)"
  tt=$(echo "$tt + $t_this" | bc -l); to=$(echo "$to + $t_other" | bc -l)
done
printf 'build time this/other over all rounds = %.3f  (goal <= 1.05)\n' "$(echo "$tt / $to" | bc -l)"
same=identical
for f in "$tmp/regress-this-$n"/shard-*.mdb; do
  cmp -s "$f" "$tmp/regress-other-$n/$(basename "$f")" || same=different
done
echo "shards of the two caches: $same"
