#!/bin/bash
# kiln.ray on a local Ray cluster of 2 CPUs against one process with 2 threads or
# workers (issue 40), on the bench corpus of N images (bench/make_corpus.sh),
# interleaved, ROUNDS rounds: kiln.ray.build against kiln build (the same arguments:
# --max-side 256 --dtype uint8 --norm imagenet), and kiln.ray.write_dataset against
# kiln.write_dataset(workers=2) of a PIL-decoding dataset (bench/ray_bench.py). Checks
# that each Ray cache holds the records of its one-process twin. Ray comes from PyPI
# into a venv of its own ($KILN_BENCH_TMP/venv-ray, seeing Debian's numpy and PIL), at
# the version tools/torch-requirements.txt pins. A benchmark, not a test: exits 0
# whatever the figures (2 when a side fails).
# usage: bench/ray_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln),
#      PYTHONPATH (default <repo>/build/python)
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
need_debs python3-numpy python3-pil python3-venv
kiln_module
venv=$tmp/venv-ray
pin=$(grep '^ray==' "$repo/tools/torch-requirements.txt")
if [ "$(cat "$venv/.ready" 2>/dev/null)" != "$pin" ]; then
  echo "# a venv with $pin in $venv ..." >&2
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q "$pin" >&2
  echo "$pin" >"$venv/.ready"
fi
src=$tmp/corpus-$n
warm_corpus "$src" "$n"
echo "== ray_bench: $n images, $rounds rounds, 2 CPUs each side, load $(cut -d' ' -f1 /proc/loadavg)"
# The Ray workers import kiln and bench/append_bench.py (the dataset) from PYTHONPATH.
# (PIL's libpng warnings about the corpus's PNG profiles and Ray's start-up lines dropped.)
PYTHONPATH=$PYTHONPATH:$here "$venv/bin/python" "$here/ray_bench.py" "$src" "$tmp/ray-bench" "$kiln" "$rounds" 2>&1 \
  | grep -v -e '^libpng warning' -e 'authentication_token_setup' -e 'Started a local Ray instance' \
  || { echo "ray_bench: a side failed" >&2; exit 2; }
