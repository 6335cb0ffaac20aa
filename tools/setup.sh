#!/bin/bash
# kiln's one set-up script: installs the Debian packages kiln needs (only
# those missing; idempotent), configures and builds into build/, then runs
# the demo (build a cache of sample_data, verify it, inspect it, train on it) or the
# test suite.
#   usage: tools/setup.sh demo|test|build
set -euo pipefail
mode=${1:-demo}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pkgs=(build-essential cmake ninja-build pkg-config
      liblmdb-dev libxxhash-dev nlohmann-json3-dev libcli11-dev libtbb-dev catch2
      libopencv-dev libturbojpeg0-dev libtorch-dev libgloo-dev
      python3-dev pybind11-dev python3-pybind11    # the Python module kiln
      python3-matplotlib)                          # kiln plot
# The tests compare kiln with torchvision/PIL and read caches from Python.
[ "$mode" = test ] && pkgs+=(python3 python3-numpy python3-pil python3-torch python3-torchvision python3-lmdb python3-venv python3-setuptools python3-wheel)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

echo "== building kiln in build/"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"

case "$mode" in
  build) ;;
  demo)
    out=${KILN_DEMO_OUT:-build/demo}
    echo "== kiln build: sample_data/fashion -> $out"
    # Fashion-MNIST's per-channel statistics, the same for both splits.
    norm=(--channels 1 --dtype float16 --mean 0.2860 --std 0.3530)
    build/kiln build sample_data/fashion/train "$out/train" "${norm[@]}"
    build/kiln build sample_data/fashion/val "$out/val" "${norm[@]}"
    echo "== kiln build again: nothing to do"
    build/kiln build sample_data/fashion/train "$out/train" "${norm[@]}"
    echo "== kiln verify"
    build/kiln verify "$out/train"
    build/kiln verify "$out/val"
    echo "== kiln verify val --against train: no validation image is also a training image"
    build/kiln verify "$out/val" --against "$out/train" --progress none
    echo "== kiln inspect"
    build/kiln inspect "$out/train"
    echo "== kiln preview: a labelled contact sheet of 20 records"
    build/kiln preview "$out/train" -o "$out/preview.png" --count 20
    echo "== kiln train: the built-in cnn on the cache (CPU or GPU), checkpoint and TorchScript export"
    build/kiln train --data "$out/train" --val "$out/val" --model cnn --epochs 5 --batch-size 32 \
      --log-every 5 --metrics "$out/metrics.jsonl" --save "$out/checkpoint" --export "$out/cnn.pt"
    echo "== kiln plot: the training curves"
    build/kiln plot "$out/metrics.jsonl" -o "$out/curves.png"
    ;;
  test)
    echo "== tests"
    # Everything a test needs is installed above: a test that would skip
    # (no kiln build, no Gloo, no PIL...) fails instead.
    cd build && KILN_TESTS_MUST_RUN=1 ctest --output-on-failure -j "$(nproc)"
    ;;
  *) echo "usage: tools/setup.sh demo|test|build" >&2; exit 2 ;;
esac
