#!/bin/bash
# The benchmark corpus: N (default 4000) ImageNet-like images in 40 class folders,
# cut by bench/make_corpus.py (seed SEED, default 1) from the real photographs that
# Debian's python3-skimage ships in skimage/data (installed here if missing).
# usage: bench/make_corpus.sh OUT [N=4000] [SEED=1]
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
out=${1:?usage: make_corpus.sh OUT [N=4000] [SEED=1]}; n=${2:-4000}; seed=${3:-1}
case $n$seed in ''|*[!0-9]*) echo "usage: make_corpus.sh OUT [N=4000] [SEED=1]" >&2; exit 2 ;; esac
need_debs python3-skimage python3-pil
# skimage/data without importing skimage (find_spec only locates the package: fast)
data=$("$py" -c "import importlib.util as u, os; print(os.path.join(u.find_spec('skimage').submodule_search_locations[0], 'data'))")
photos=()
for f in astronaut.png coffee.png chelsea.png motorcycle_left.png motorcycle_right.png rocket.jpg \
         hubble_deep_field.jpg retina.jpg grass.png gravel.png brick.png camera.png ihc.png coins.png; do
  [ -f "$data/$f" ] && photos+=("$data/$f")
done
[ ${#photos[@]} -gt 0 ] || { echo "no photographs in $data" >&2; exit 2; }
"$py" "$here/make_corpus.py" "$out" "$n" 40 "${photos[@]}" --seed "$seed"
echo "corpus: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1) in $out"
