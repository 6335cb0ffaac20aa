#!/bin/bash
# JPEG records (issue 39), in one run: bytes on disk and build time of `kiln build --encode jpeg`
# against the uint8 cache of the same images; a passthrough build of JPEG sources against the
# sources' bytes; RandomResizedCrop epochs (bench/jpeg_bench.py: kiln JPEG, kiln raw, a Python
# peer over the same JPEG bytes); and, where root can make a memory cgroup, a cold epoch of
# each cache under a limit of the loader's own memory plus a third of the raw cache's bytes.
# usage: bench/jpeg_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln),
#      KILN_PYTHONPATH (default <repo>/build/python)
# A benchmark, not a test: exits 0 whatever the figures (2 when a step fails).
set -uo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
need_peers >/dev/null 2>&1 || true
export PYTHONPATH=${KILN_PYTHONPATH:-$repo/build/python}
pc=$bench/peers/peer_common.py
src=$tmp/corpus-$n
corpus "$src" "$n"
work=$tmp/jpeg-$n
mkdir -p "$work"
bytes() { "$py" "$pc" bytes "$@"; }
shards() { bytes "$1"/shard-*.mdb; }
now() { date +%s.%N; }
build() {  # build OUT ARGS...: one fresh build, prints its seconds
  local out=$1; shift
  rm -rf "$out"
  local t0; t0=$(now)
  "$kiln" build "$@" "$out" --norm imagenet --threads 2 --progress none >"$out.log" 2>&1 \
    || { echo "kiln build $* failed: $(tail -1 "$out.log")" >&2; exit 2; }
  echo "$(now) - $t0" | bc
}

# 1. Builds, interleaved: uint8 pixels and JPEG q90, both --max-side 256.
best_raw=999999; best_jpeg=999999
for r in $(seq 1 "$rounds"); do
  t=$(build "$work/raw" "$src" --max-side 256 --dtype uint8)
  best_raw=$(echo "if ($t < $best_raw) $t else $best_raw" | bc)
  t=$(build "$work/jpeg" "$src" --max-side 256 --encode jpeg)
  best_jpeg=$(echo "if ($t < $best_jpeg) $t else $best_jpeg" | bc)
  echo "# round $r: builds done" >&2
done
raw_b=$(shards "$work/raw"); jpeg_b=$(shards "$work/jpeg")

# 2. Passthrough: the corpus's JPEG files only (links in the same class folders), no resize.
jsrc=$work/jpeg-sources
if [ ! -d "$jsrc" ]; then
  (cd "$src" && find . -name '*.jpg' | while read -r f; do
     mkdir -p "$jsrc/$(dirname "$f")"; ln -s "$src/$f" "$jsrc/$f"; done)
fi
build "$work/pass" "$jsrc" --max-side 1000000 --encode jpeg >/dev/null
src_b=$("$py" -c 'import os,sys; print(sum(os.path.getsize(os.path.realpath(os.path.join(d,f))) for d,_,fs in os.walk(sys.argv[1]) for f in fs))' "$jsrc")
pass_b=$(shards "$work/pass")
pay_b=$("$py" -c '
import sys, kiln
c = kiln.Cache(sys.argv[1])
print(sum(c.read(i, decode=False)["image"].size for i in range(len(c))))' "$work/pass")

echo "jpeg_bench: corpus of $n images ($src), kiln $kiln, best of $rounds builds"
printf "| %-52s | %12s | %8s |\n" what bytes seconds
printf "| %-52s | %12s | %8s |\n" "----" "----" "----"
printf "| %-52s | %12s | %8.2f |\n" "kiln build --max-side 256 --dtype uint8" "$raw_b" "$best_raw"
printf "| %-52s | %12s | %8.2f |\n" "kiln build --max-side 256 --encode jpeg (q90)" "$jpeg_b" "$best_jpeg"
printf "| %-52s | %12s | %8s |\n" "the corpus's JPEG files ($(find "$jsrc" -name '*.jpg' | wc -l))" "$src_b" "-"
printf "| %-52s | %12s | %8s |\n" "kiln build of them, --encode jpeg (passthrough)" "$pass_b" "-"
printf "| %-52s | %12s | %8s |\n" "  of which the stored JPEGs" "$pay_b" "-"
ratio() { echo "scale=4; $1 / $2" | bc; }
echo "JPEG cache / uint8 cache bytes     = $(ratio "$jpeg_b" "$raw_b")  (goal <= 0.25)"
echo "passthrough shards / source bytes  = $(ratio "$pass_b" "$src_b")  (goal <= 1.02; stored JPEGs / sources = $(ratio "$pay_b" "$src_b"))"
echo "uint8 build time / JPEG build time = $(ratio "$best_raw" "$best_jpeg")  (goal >= 1)"

# 3. Epochs, warm, interleaved.
batch=256; [ "$n" -ge 1024 ] || batch=$(( n / 4 > 0 ? n / 4 : 1 ))  # a small corpus: smaller batches
"$py" "$here/jpeg_bench.py" "$work/jpeg" "$work/raw" --rounds "$rounds" --batch "$batch" \
  || { echo "jpeg_bench.py failed" >&2; exit 2; }

# 4. A cold epoch of each cache in a memory cgroup: the loader's own memory (its peak in a
#    warm epoch of the raw cache under no limit) plus a third of the raw cache's bytes.
if [ "$("$py" "$pc" cgroup-probe 2>/dev/null)" = none ] || ! "$py" "$pc" cgroup-probe >/dev/null 2>&1; then
  echo "cgroup: not measured: no memory cgroup control here (needs root)"
  exit 0
fi
epoch() { "$py" "$bench/peers_bench_kiln.py" epoch "$1" rrc 2 256; }
"$py" "$pc" warm "$work/raw"
"$py" "$pc" cgrun 0 -- "$py" "$bench/peers_bench_kiln.py" epoch "$work/raw" rrc 2 256 >"$work/own.log" 2>&1
own=$(sed -n 's/.*usage_peak=\([0-9]*\).*/\1/p' "$work/own.log")
peak=$(sed -n 's/.*peak_bytes=\([0-9]*\).*/\1/p' "$work/own.log")
[ -n "$peak" ] && [ -n "$own" ] && [ "$peak" -gt "$own" ] && own=$peak
limit=$(( ${own:-0} + raw_b / 3 ))
for r in $(seq 1 "$rounds"); do
  for side in raw jpeg; do
    "$py" "$pc" drop "$work/$side"
    "$py" "$pc" cgrun "$limit" -- "$py" "$bench/peers_bench_kiln.py" epoch "$work/$side" rrc 2 256 \
      >"$work/cg-$side-$r.log" 2>&1
    rate=$(sed -n 's/.*images_per_s=\([0-9.]*\).*/\1/p' "$work/cg-$side-$r.log")
    echo "cgroup round $r: $side ${rate:-failed: $(tail -1 "$work/cg-$side-$r.log")} samples/s (limit $limit bytes)"
  done
done
