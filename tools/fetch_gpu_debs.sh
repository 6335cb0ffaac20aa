#!/bin/bash
# Fetches, on a development machine, what tools/gpu_check.sh needs on a lent
# GPU machine that reaches no package registry: the Debian packages of kiln's
# core, trainer and tests (headers and shared libraries; not OpenCV or
# TurboJPEG: the image part is not built there) and the pybind11 wheel that
# builds the Python module against NumPy 2 (Debian 12's pybind11 2.10 cannot).
# gpu_check.sh unpacks them into a prefix (dpkg -x), never into /.
#   usage: tools/fetch_gpu_debs.sh [DIR=.gpu-debs]
# DIR is git-ignored (.gitignore) and travels with the working tree to the GPU
# machine (the device tool's carry list).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.gpu-debs}
mkdir -p "$dir"
cd "$dir"
apt-get download -q liblmdb-dev liblmdb0 libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 \
  libxxhash-dev libxxhash0 nlohmann-json3-dev libcli11-dev catch2 >/dev/null
pybind11=$(grep '^pybind11==' "$root/tools/torch-requirements.txt")
python3 -m pip download -q --no-deps -d . "$pybind11"
ls
du -sh .
