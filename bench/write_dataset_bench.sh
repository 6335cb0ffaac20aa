#!/bin/bash
# kiln.write_dataset against the Python PIL + lmdb peer (bench/peers/pylmdb_cache.py
# build), interleaved in one run (issue 23).
# usage: bench/write_dataset_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), PYTHONPATH must reach the kiln module
#      (default <repo>/build/python)
# Installs the Debian packages the peer and torchvision need if missing (apt-get).
# Each round runs, on the bench corpus of N JPEGs (warm in the page cache), 2 processes each:
#   peer         pylmdb_cache.py build: PIL resize 256 + crop 224 + float16 normalize, pickled
#                into one LMDB (no fsync)
#   imagefolder  kiln.write_dataset(ImageFolder + Resize(256)+CenterCrop(224)+PILToTensor),
#                uint8 records (the issue's configuration: less per-image work than the peer)
#   peer-prep    kiln.write_dataset over the peer's own prep() (same PIL work and float16
#                bytes as the peer: only the path from the workers to the disk differs)
# and prints each side's images/s and the ratios kiln/peer per round and over all rounds
# (median). A benchmark, not a test: exits 0 whatever the figures (2 when a side fails).
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
need_peers
kiln_module
src=$tmp/corpus-$n
warm_corpus "$src" "$n"
out=$tmp/write-bench
rate() { sed -n 's/.*images_per_s=\([0-9.]*\).*/\1/p' | tail -1; }
declare -A all
echo "== write_dataset_bench: N=$n, $rounds rounds, 2 processes per side, load $(cut -d' ' -f1 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  line="round $r:"
  for side in peer imagefolder peer-prep; do
    rm -rf "$out"
    if [ "$side" = peer ]; then
      v=$("$py" "$bench/peers/pylmdb_cache.py" build "$src" "$out" 2 | rate)
    else
      v=$("$py" "$here/write_dataset_bench.py" "$side" "$src" "$out" "$bench/peers/pylmdb_cache.py" 2 | rate)
    fi
    [ -n "$v" ] || { echo "side $side printed no rate" >&2; exit 2; }
    all[$side]="${all[$side]:-} $v"
    line="$line $side=$v/s"
    eval "r_${side//-/_}=$v"
  done
  echo "$line  imagefolder/peer=$(echo "$r_imagefolder / $r_peer" | bc -l | xargs printf %.2f)  peer-prep/peer=$(echo "$r_peer_prep / $r_peer" | bc -l | xargs printf %.2f)" 2>/dev/null || true
done
rm -rf "$out"
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
p=$(med "${all[peer]}"); a=$(med "${all[imagefolder]}"); b=$(med "${all[peer-prep]}")
printf 'median images/s: peer %s, kiln imagefolder %s, kiln peer-prep %s\n' "$p" "$a" "$b"
printf 'write_dataset(ImageFolder, uint8) / peer = %.2f  (goal >= 1.5)\n' "$(echo "$a / $p" | bc -l)"
printf 'write_dataset(peer prep, float16) / peer = %.2f  (same work and bytes)\n' "$(echo "$b / $p" | bc -l)"
