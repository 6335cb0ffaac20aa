#!/bin/bash
# kiln build of whole images (--max-side 256, uint8, a format 2 cache: issue 23) against
# today's fixed cache (--resize 256 --crop 224, float16), interleaved in one run.
# usage: bench/whole_build_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Each round builds the bench corpus (warm) both ways with --threads 2 --force and prints the
# build times (kiln build's own "in X ms") and the shards' bytes; then the ratios:
# whole/fixed time (goal <= 1: at least as fast) and bytes (goal about 0.5 or less).
# A benchmark, not a test: exits 0 whatever the figures (2 when a build fails).
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
src=$tmp/corpus-$n
corpus "$src" "$n"
cat "$src"/*/* >/dev/null
ms() { sed -n 's/.* in \([0-9.]*\) \(ms\|s\) .*/\1 \2/p' | head -1 | awk '{print ($2 == "s") ? $1 * 1000 : $1}'; }
bytes() { cat "$1"/shard-*.mdb | wc -c; }
tf=0; tw=0
echo "== whole_build_bench: N=$n, $rounds rounds, --threads 2, load $(cut -d' ' -f1 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  f=$("$kiln" build "$src" "$tmp/fixed-$n" --resize 256 --crop 224 --dtype float16 --norm imagenet \
      --threads 2 --force --progress none 2>&1 | ms) || exit 2
  w=$("$kiln" build "$src" "$tmp/whole-$n" --max-side 256 --dtype uint8 --norm imagenet \
      --threads 2 --force --progress none 2>&1 | ms) || exit 2
  [ -n "$f" ] && [ -n "$w" ] || { echo "could not parse a build time" >&2; exit 2; }
  echo "round $r: fixed (resize 256, crop 224, float16) ${f} ms, whole (max-side 256, uint8) ${w} ms, whole/fixed = $(echo "$w / $f" | bc -l | xargs printf %.2f)"
  tf=$(echo "$tf + $f" | bc -l); tw=$(echo "$tw + $w" | bc -l)
done
bf=$(bytes "$tmp/fixed-$n"); bw=$(bytes "$tmp/whole-$n")
printf 'build time whole/fixed over all rounds = %.2f  (goal <= 1.00)\n' "$(echo "$tw / $tf" | bc -l)"
printf 'bytes on disk: fixed %s, whole %s, whole/fixed = %.2f  (goal about 0.5 or less)\n' \
  "$(numfmt --to=iec "$bf")" "$(numfmt --to=iec "$bw")" "$(echo "$bw / $bf" | bc -l)"
