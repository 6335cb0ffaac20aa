#!/bin/bash
# RandomResizedCrop(224) + flip at load time (issue 24): kiln.Loader against a Python peer
# (DataLoader over an LMDB of the same uint8 images with torchvision's RandomResizedCrop), the
# memcpy floor of the same output bytes and torchvision's ImageFolder, in one run.
# usage: bench/augment_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln),
#      KILN_PYTHONPATH (default <repo>/build/python)
# Builds (or reuses) the bench corpus and its cache of whole images (kiln build --max-side 256
# --dtype uint8 --norm imagenet), then runs bench/augment_bench.py (its docstring says what each
# figure is). A benchmark, not a test: exits 0 whatever the figures (2 when a step fails).
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}; rounds=${2:-2}
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
export PYTHONPATH=${KILN_PYTHONPATH:-$repo/build/python}
src=$tmp/corpus-$n
corpus "$src" "$n"
cache=$tmp/whole-$n
"$kiln" build "$src" "$cache" --max-side 256 --dtype uint8 --norm imagenet --threads 2 \
  --progress none >/dev/null 2>&1 || { echo "kiln build failed" >&2; exit 2; }
"$py" "$here/augment_bench.py" "$cache" "$src" --rounds "$rounds"
