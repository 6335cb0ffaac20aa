#!/bin/bash
# kiln's one set-up script: installs the Debian packages kiln needs (only
# those missing; idempotent), configures and builds, then runs the demo
# (build a cache of sample_data, verify it, inspect it, train on it) or the
# test suite.
#   usage: tools/setup.sh demo|test|build|gpu|cuda-test
#   demo, test, build: against Debian's LibTorch 1.13 (CPU only), into build/.
#   gpu:       against a CUDA PyTorch, into build-cuda/ (kiln, kiln-train and
#              the Python module for that Python): the user's own with
#              KILN_PYTHON=/path/to/python, else the torch pinned in
#              tools/torch-requirements.txt, installed from PyPI into a venv
#              under ~/.cache/kiln (the wheels kept there for reruns). Needs
#              the CUDA toolkit (nvcc, CUDA_HOME, default /usr/local/cuda);
#              no GPU is needed to build.
#   cuda-test: gpu, then the test suite on that build (CI; device-free tests
#              run, [cuda] ones say they skipped where there is no GPU).
set -euo pipefail
mode=${1:-demo}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
case "$mode" in demo|test|build|gpu|cuda-test) ;;
  *) echo "usage: tools/setup.sh demo|test|build|gpu|cuda-test" >&2; exit 2 ;;
esac

pkgs=(build-essential cmake ninja-build pkg-config
      liblmdb-dev libxxhash-dev nlohmann-json3-dev libcli11-dev libtbb-dev catch2
      libjpeg62-turbo-dev                          # JPEG record fields (libjpeg API)
      libopencv-dev libturbojpeg0-dev
      python3-dev pybind11-dev python3-pybind11    # the Python module kiln
      python3-matplotlib)                          # kiln plot
case "$mode" in
  gpu|cuda-test) pkgs+=(python3-venv) ;;           # the venv of the pinned torch
  *) pkgs+=(libtorch-dev libgloo-dev) ;;           # Debian's LibTorch, c10d's Gloo
esac
# The tests compare kiln with torchvision/PIL and read caches from Python.
[ "$mode" = test ] && pkgs+=(python3 python3-numpy python3-pil python3-torch python3-torchvision python3-lmdb python3-venv python3-setuptools python3-wheel)
# The CUDA build's tests: PIL for kiln's own image tests, setuptools/wheel for pip install.
[ "$mode" = cuda-test ] && pkgs+=(python3-pil python3-numpy python3-setuptools python3-wheel python3-skimage)

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

# The CUDA build (gpu, cuda-test): a Python with a CUDA torch, then kiln
# against that torch's LibTorch, with nvcc and NCCL.
if [ "$mode" = gpu ] || [ "$mode" = cuda-test ]; then
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  if [ ! -x "$cuda_home/bin/nvcc" ]; then
    echo "tools/setup.sh $mode: no CUDA toolkit at $cuda_home (no bin/nvcc): install CUDA 12/13 or set CUDA_HOME" >&2
    exit 2
  fi
  if [ -n "${KILN_PYTHON:-}" ]; then
    py=$KILN_PYTHON
    echo "== the PyTorch of $py (KILN_PYTHON)"
  else
    req=tools/torch-requirements.txt
    cache=${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}
    wheels=$cache/wheels
    tag=$(grep -v '^#' "$req" | sha256sum | cut -c1-12)
    venv=$cache/venv-$tag
    py=$venv/bin/python
    if [ "$(cat "$venv/.kiln-ready" 2>/dev/null)" != "$tag" ]; then
      echo "== a venv with $(grep '^torch==' "$req") in $venv (wheels kept in $wheels)"
      t0=$SECONDS
      rm -rf "$venv"
      /usr/bin/python3 -m venv "$venv"
      mkdir -p "$wheels"
      # pip download skips the files the folder already has: a rerun fetches nothing.
      "$py" -m pip download -q -d "$wheels" -r "$req"
      "$py" -m pip install -q --no-index --find-links "$wheels" -r "$req"
      echo "$tag" >"$venv/.kiln-ready"
      echo "== venv ready in $((SECONDS - t0)) s"
    fi
  fi
  bdir=build-cuda
  echo "== building kiln against that LibTorch (CUDA) in $bdir/"
  tools/configure_cuda.sh "$bdir" "$py"
  t0=$SECONDS
  cmake --build "$bdir" -j "$(nproc)"
  echo "== built in $((SECONDS - t0)) s; kiln-train links: $(ldd "$bdir/kiln-train" | grep -oE 'lib(torch_cuda|c10_cuda|nccl|cudart)\.so[^ ]*' | sort -u | tr '\n' ' ')"
  ldd "$bdir/kiln-train" | grep -q 'libtorch_cuda.so' ||
    { echo "tools/setup.sh $mode: $bdir/kiln-train does not link libtorch_cuda.so" >&2; exit 1; }
  if [ "$mode" = gpu ]; then
    echo "== done: $bdir/kiln (train --device cuda), PYTHONPATH=$root/$bdir/python $py -c 'import kiln'"
  else
    echo "== tests of the CUDA build (torch from $py; [cuda] cases skip without a GPU)"
    # KILN_CTEST_EXCLUDE: a regex of tests not to run (.ci/run names those
    # still failing on the current torch, with the reason).
    cd "$bdir" && KILN_TESTS_MUST_RUN=1 ctest --output-on-failure -j "$(nproc)" \
      ${KILN_CTEST_EXCLUDE:+-E "$KILN_CTEST_EXCLUDE"}
  fi
  exit 0
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
esac
