#!/bin/bash
# Configures kiln's CUDA build against the LibTorch inside a Python's CUDA
# torch wheel: the one configuration that CI (tools/setup.sh gpu|cuda-test)
# and the lent GPU machine (tools/gpu_check.sh) share, so that what CI
# compiles is what runs on the GPU.
#   usage: tools/configure_cuda.sh BUILD_DIR PYTHON [CMAKE_ARG...]
# BUILD_DIR is configured with Ninja, Release, KILN_REQUIRE_CUDA=ON (every
# CUDA file and NCCL compiled, or the configure fails), nvcc from CUDA_HOME
# (default /usr/local/cuda), nccl.h found by tools/find_nccl.py (the
# nvidia-nccl wheel beside torch), pybind11 from PYTHON's pybind11 package
# (else KILN_PYBIND11_DIR), the tests run by PYTHON. Extra CMAKE_ARGs come
# last (gpu_check.sh adds -DKILN_WITH_IMAGE=OFF); KILN_PREFIX_PATH is added
# to CMAKE_PREFIX_PATH (the unpacked Debian packages of the GPU machine).
# Prints kiln's configure summary; exits 2 with one line when it cannot.
set -euo pipefail
bdir=${1:?usage: tools/configure_cuda.sh BUILD_DIR PYTHON [CMAKE_ARG...]}
py=${2:?usage: tools/configure_cuda.sh BUILD_DIR PYTHON [CMAKE_ARG...]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda_home/bin/nvcc" ] ||
  { echo "configure_cuda.sh: no CUDA toolkit at $cuda_home (no bin/nvcc): install CUDA 12/13 or set CUDA_HOME" >&2; exit 2; }
"$py" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 3)' 2>/dev/null ||
  { echo "configure_cuda.sh: $py has no CUDA torch (import torch failed, or torch.version.cuda is None): use a CUDA wheel" >&2; exit 2; }
"$py" -c 'import torch; print("== torch %s, CUDA %s, at %s" % (torch.__version__, torch.version.cuda, torch.__file__))'
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
nccl_inc=$("$py" "$root/tools/find_nccl.py")
# NumPy 2 (what current torch brings) needs pybind11 >= 2.12; Debian 12's is 2.10.
pybind11_dir=$("$py" -m pybind11 --cmakedir 2>/dev/null || echo "${KILN_PYBIND11_DIR:-}")
# TORCH_LIBRARY, c10_LIBRARY: TorchConfig's find_library would take Debian's
# libtorch-dev first where that is installed too.
mkdir -p "$bdir"
log=$bdir/kiln-configure.log
if ! cmake -S "$root" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_REQUIRE_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake${KILN_PREFIX_PATH:+;$KILN_PREFIX_PATH}" \
  -DTORCH_LIBRARY="$torch_dir/lib/libtorch.so" -Dc10_LIBRARY="$torch_dir/lib/libc10.so" \
  -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCUDAToolkit_ROOT="$cuda_home" \
  ${nccl_inc:+-DKILN_NCCL_INCLUDE_DIR="$nccl_inc"} -DPython3_EXECUTABLE="$py" -DKILN_TEST_PYTHON="$py" \
  ${pybind11_dir:+-Dpybind11_DIR="$pybind11_dir"} "$@" >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "configure_cuda.sh: configuring $bdir failed (log: $log)" >&2
  exit 2
fi
grep -E '^-- kiln' "$log" || true
