#!/bin/bash
# Appending to a cache against writing it again (issue 40): on the bench corpus of
# N + N/10 images (bench/make_corpus.sh), interleaved, ROUNDS rounds:
#   full    kiln.write_dataset of all N + N/10 images into a new cache (the rebuild)
#   append  kiln.write_dataset(append=True) of the last N/10 onto a cache of the first N
#           (made untimed just before)
# both with 2 worker processes, PIL decode + resize to a longer side of 256, uint8
# records (bench/append_bench.py). Prints each round's seconds and append/full
# (goal <= 0.15), then checks that the appended cache holds the same records as
# the rebuilt one. A benchmark, not a test: exits 0 whatever the figures (2 when
# a side fails).
# usage: bench/append_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), PYTHONPATH (default <repo>/build/python)
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
extra=$((n / 10)); total=$((n + extra))
need_debs python3-numpy python3-pil
kiln_module
src=$tmp/corpus-$total
warm_corpus "$src" "$total"
out=$tmp/append-bench
secs() { sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' | tail -1; }
side() { "$py" "$here/append_bench.py" "$@" | secs; }
echo "== append_bench: $n images + $extra appended, against a write of all $total; $rounds rounds, 2 workers, load $(cut -d' ' -f1 /proc/loadavg)"
ratios=()
for r in $(seq 1 "$rounds"); do
  rm -rf "$out"; mkdir -p "$out"
  side base "$src" "$out/grown" "$n" >/dev/null
  a=$(side append "$src" "$out/grown" "$n")
  f=$(side full "$src" "$out/full" "$n")
  [ -n "$a" ] && [ -n "$f" ] || { echo "a side printed no time" >&2; exit 2; }
  q=$(echo "$a / $f" | bc -l)
  ratios+=("$q")
  printf 'round %d: append %s s, full %s s, append/full %.3f\n' "$r" "$a" "$f" "$q"
done
# The grown cache and the rebuilt one: the same records (the last round's).
"$py" - "$out/grown" "$out/full" <<'PY' || { echo "append_bench: the appended cache differs from the rebuilt one" >&2; exit 2; }
import sys, kiln, numpy as np
a, b = kiln.Cache(sys.argv[1]), kiln.Cache(sys.argv[2])
assert len(a) == len(b), (len(a), len(b))
for i in range(len(a)):
    x, y = a.read(i, verify=True), b.read(i)
    assert all(np.array_equal(x[k], y[k]) for k in x), i
print("same records: %d in the grown cache and the rebuilt one; appends %s"
      % (len(a), [(e["count_before"], e["count_after"]) for e in a.manifest["appends"]]))
PY
best=$(printf '%s\n' "${ratios[@]}" | sort -n | head -1)
printf 'append/full (best of %d rounds) = %.3f  (goal <= 0.15)\n' "$rounds" "$best"
rm -rf "$out"
