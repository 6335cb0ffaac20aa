#!/bin/bash
# Appending to a cache against writing it again (issue 40): on the bench corpus of
# N + N/10 images (bench/make_corpus.sh), interleaved, ROUNDS rounds, two pairs:
#   kiln build: `kiln build TREE OUT --max-side 256 --norm imagenet --threads 2` of a tree
#           of links to the first N files (untimed), then the other N/10 linked in and
#           `kiln build ... --append` (timed), against `kiln build` of all N + N/10 files
#           into a new cache;
#   write_dataset: kiln.write_dataset(append=True) of the last N/10 onto a cache of the
#           first N (made untimed just before), against write_dataset of all N + N/10;
#           2 worker processes, PIL decode + resize to a longer side of 256, uint8 records
#           (bench/append_bench.py).
# Prints each round's seconds and append/full (goal <= 0.15), then checks that each
# grown cache verifies and holds as many records as the rebuilt one (write_dataset's:
# the same records, one by one). A benchmark, not a test: exits 0 whatever the
# figures (2 when a side fails).
# usage: bench/append_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln),
#      PYTHONPATH (default <repo>/build/python)
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
kflags=(--max-side 256 --norm imagenet --threads 2 --progress none)
# link_tree DIR FIRST COUNT: links to COUNT of the corpus's files from the FIRST-th on
# (1-based, ImageFolder order) at their relative paths in DIR.
link_tree() {
  find "$src" -type f | sort | tail -n +"$2" | head -n "$3" | while read -r f; do
    rel=${f#"$src"/}; mkdir -p "$1/$(dirname "$rel")"; ln "$f" "$1/$rel"
  done
}
now() { date +%s.%N; }
ratios=(); kratios=()
for r in $(seq 1 "$rounds"); do
  rm -rf "$out"; mkdir -p "$out"
  link_tree "$out/tree" 1 "$n"
  "$kiln" build "$out/tree" "$out/kgrown" "${kflags[@]}" >/dev/null 2>&1 || { echo "kiln build of the first $n failed" >&2; exit 2; }
  link_tree "$out/tree" $((n + 1)) "$extra"
  t0=$(now); "$kiln" build "$out/tree" "$out/kgrown" "${kflags[@]}" --append >/dev/null 2>&1 || { echo "kiln build --append failed" >&2; exit 2; }; t1=$(now)
  "$kiln" build "$out/tree" "$out/kfull" "${kflags[@]}" >/dev/null 2>&1 || { echo "kiln build of all $total failed" >&2; exit 2; }; t2=$(now)
  ka=$(echo "$t1 - $t0" | bc -l); kf=$(echo "$t2 - $t1" | bc -l); kq=$(echo "$ka / $kf" | bc -l)
  kratios+=("$kq")
  side base "$src" "$out/grown" "$n" >/dev/null
  a=$(side append "$src" "$out/grown" "$n")
  f=$(side full "$src" "$out/full" "$n")
  [ -n "$a" ] && [ -n "$f" ] || { echo "a side printed no time" >&2; exit 2; }
  q=$(echo "$a / $f" | bc -l)
  ratios+=("$q")
  printf 'round %d: kiln build --append %.3f s, kiln build of all %.3f s, append/full %.3f; write_dataset append %s s, full %s s, append/full %.3f\n' \
    "$r" "$ka" "$kf" "$kq" "$a" "$f" "$q"
done
"$kiln" verify "$out/kgrown" --progress none | tail -1
g=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['count'])" "$out/kgrown/manifest.json")
w=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['count'])" "$out/kfull/manifest.json")
[ "$g" = "$w" ] || { echo "append_bench: kiln build --append holds $g records, the rebuild $w" >&2; exit 2; }
echo "kiln build --append: $g records, as many as the rebuild"
kbest=$(printf '%s\n' "${kratios[@]}" | sort -n | head -1)
printf 'kiln build --append / kiln build of all (best of %d rounds) = %.3f  (goal <= 0.15)\n' "$rounds" "$kbest"
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
printf 'write_dataset append / write of all (best of %d rounds) = %.3f  (goal <= 0.15)\n' "$rounds" "$best"
rm -rf "$out"
