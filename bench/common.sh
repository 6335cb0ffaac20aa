# Common set-up of the bench scripts (sourced): paths, overridable by env.
#   KILN_BENCH_TMP     default /tmp/kiln-bench
#   KILN               default <repo>/build/kiln
# Everything the scripts run lives in bench/: the corpus generator (make_corpus.sh,
# make_corpus.py), the Python peers (peers/), the decode floor probe (limits/) and the
# run timer (timed.py).
# here: the folder of the script that sources this; bench: this file's own.
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[1]:-${BASH_SOURCE[0]}}")" && pwd)
repo=$(cd "$bench/.." && pwd)
tmp=${KILN_BENCH_TMP:-/tmp/kiln-bench}
kiln=${KILN:-$repo/build/kiln}
py=/usr/bin/python3

# need_debs PKG...: apt-get install the Debian packages of the list that are not
# installed (none: does nothing), with sudo unless root, as tools/setup.sh does.
need_debs() {
  local p missing=() sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null || { echo "missing packages (no apt-get here): ${missing[*]}" >&2; return 1; }
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "# installing: ${missing[*]}" >&2
  # the package lists may be stale or absent: update and retry once
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || { $sudo apt-get update -q >&2 \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
}

# need_peers: what bench/peers/*.py import (Debian's torch, torchvision, lmdb, PIL).
need_peers() { need_debs python3-numpy python3-pil python3-lmdb python3-torch python3-torchvision; }

# corpus DIR N: the benchmark corpus of N images in DIR (bench/make_corpus.sh), made once and reused.
corpus() {
  local d=$1 m=$2
  if [ ! -d "$d" ]; then
    echo "# making corpus of $m images in $d ..." >&2
    rm -rf "$d.tmp"
    "$bench/make_corpus.sh" "$d.tmp" "$m" >&2
    mv "$d.tmp" "$d"
  fi
}

# kiln_module: the kiln Python module on PYTHONPATH (default <repo>/build/python), or exit 2.
kiln_module() {
  export PYTHONPATH=${PYTHONPATH:-$repo/build/python}
  "$py" -c "import kiln" || { echo "no kiln module on PYTHONPATH (cmake --build build)" >&2; exit 2; }
}

# warm_corpus DIR N: corpus DIR N, then every file read once, so that every side of a
# bench reads the sources from the page cache.
warm_corpus() { corpus "$1" "$2"; cat "$1"/*/* >/dev/null; }

# floor_probe: sets probe to bench/limits/decode_floor.cc compiled into $tmp (recompiled
# when the source is newer), installing the compiler and headers if missing.
floor_probe() {
  local cc=$bench/limits/decode_floor.cc
  probe=$tmp/decode_floor
  if [ ! -x "$probe" ] || [ "$cc" -nt "$probe" ]; then
    need_debs g++ pkg-config libturbojpeg0-dev libopencv-dev
    echo "# compiling $probe ..." >&2
    mkdir -p "$tmp"
    g++ -O2 -std=c++17 "$cc" -o "$probe.tmp" $(pkg-config --cflags --libs libturbojpeg opencv4)
    mv "$probe.tmp" "$probe"
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

# fashion_data: Fashion-MNIST (Debian's dataset-fashion-mnist IDX files) as
# ImageFolder PNG trees $tmp/fashion-png/{train,test}/<label>_<name>/<index>.png
# (made once, reused when every image is there) and as kiln caches
# $tmp/fashion-cache/{train,test} (1x28x28 float16, mean 0.2860, std 0.3530;
# rebuilt with --force every call). Sets png and cache; exits 2 when the
# dataset is missing or a build fails.
fashion_data() {
  idx=/usr/share/datasets/fashion-mnist
  for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [ -f "$idx/$f" ] || { echo "missing $idx/$f (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
  done
  mkdir -p "$tmp"

  # --- IDX -> ImageFolder PNGs (class folders prefixed with the label, so sorted order = label order) ---
  png=$tmp/fashion-png
  count() { find "$1" -name '*.png' 2>/dev/null | wc -l; }
  if [ "$(count "$png/train")" != 60000 ] || [ "$(count "$png/test")" != 10000 ]; then
    echo "# converting Fashion-MNIST IDX to PNGs in $png ..." >&2
    rm -rf "$png" "$png.tmp"
    "$py" - "$idx" "$png.tmp" <<'EOF'
import gzip, os, sys
import numpy as np
from PIL import Image
src, out = sys.argv[1:]
# Same names as tools/make_sample_data.py: the label prefix makes ImageFolder's sorted class
# order equal the Fashion-MNIST label order 0..9.
names = ["0_tshirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
         "5_sandal", "6_shirt", "7_sneaker", "8_bag", "9_ankle_boot"]
assert sorted(names) == names
def read_idx(path):
    with gzip.open(path, "rb") as f:
        d = f.read()
    assert d[0] == 0 and d[1] == 0 and d[2] == 0x08, path
    ndim = d[3]
    dims = tuple(int(x) for x in np.frombuffer(d, ">u4", ndim, 4))
    assert len(d) == 4 + 4 * ndim + int(np.prod(dims)), path
    return np.frombuffer(d, np.uint8, offset=4 + 4 * ndim).reshape(dims)
for split, prefix, n in (("train", "train", 60000), ("test", "t10k", 10000)):
    x = read_idx(os.path.join(src, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(src, f"{prefix}-labels-idx1-ubyte.gz"))
    assert x.shape == (n, 28, 28) and y.shape == (n,) and y.max() == 9, (x.shape, y.shape)
    for c in names:
        os.makedirs(os.path.join(out, split, c), exist_ok=True)
    for i in range(n):
        Image.fromarray(x[i], mode="L").save(
            os.path.join(out, split, names[y[i]], f"{i:05d}.png"), compress_level=1)
    print(f"{split}: {n} images, per class {np.bincount(y, minlength=10).tolist()}", file=sys.stderr)
EOF
    mv "$png.tmp" "$png"
  fi


  # --- caches (kiln build says "up to date" and does nothing when sources and options match;
  #     --force rebuilds one left by other options or older PNGs) ---
  cache=$tmp/fashion-cache
  mkdir -p "$cache"
  for split in train test; do
    echo "# kiln build $png/$split $cache/$split ..." >&2
    t0=$(date +%s.%N)
    "$kiln" build "$png/$split" "$cache/$split" --channels 1 --dtype float16 --mean 0.2860 --std 0.3530 \
        --threads 2 --progress none --force >"$tmp/fashion-build-$split.log" 2>&1 \
      || { echo "kiln build failed, log: $tmp/fashion-build-$split.log" >&2; tail -5 "$tmp/fashion-build-$split.log" >&2; exit 2; }
    t1=$(date +%s.%N)
    echo "#   $(tail -1 "$tmp/fashion-build-$split.log") ($("$py" -c "print('%.1f' % ($t1 - $t0))") s)" >&2
  done
}
