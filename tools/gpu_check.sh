#!/bin/bash
# kiln's GPU check, for a lent GPU machine (docs/gpu.md): builds kiln's core,
# trainer, kiln-train and Python module against the CUDA LibTorch of that
# machine's PyTorch wheel with tools/configure_cuda.sh - the configuration
# CI's CUDA build uses (tools/setup.sh cuda-test), less the image part
# (-DKILN_WITH_IMAGE=OFF: the machine has no OpenCV or TurboJPEG) - with the
# Debian packages and the pybind11 wheel of .gpu-debs/ unpacked into a
# prefix; runs every test, then the [cuda] ones; trains on the GPU, and on 2
# processes over NCCL; prints a short table last. Writes logs to $OUT (or
# /tmp/kiln-gpu-out).
#
#   on a development machine, once:  tools/fetch_gpu_debs.sh
#   then, through the device tool:   bash tools/gpu_check.sh  (carry .gpu-debs)
#
# Environment (all optional): KILN_PYTHON (the Python whose torch is built
# against; default python3), KILN_DEPS_DIR (/tmp/kiln-deps), KILN_GPU_BUILD
# (/tmp/kiln-gpu-build), CUDA_HOME (/usr/local/cuda).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
deps=${KILN_DEPS_DIR:-/tmp/kiln-deps}
b=${KILN_GPU_BUILD:-/tmp/kiln-gpu-build}
out=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$out"
results=()
# step NAME COMMAND...: runs it with its output in $out/NAME.log; the table
# shows its last line, or with KEY=REGEX set its last line matching REGEX.
step() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local line
  line=$(grep -E "${KEY:-.}" "$out/$name.log" | tail -1)
  [ -n "$line" ] || line=$(tail -1 "$out/$name.log")
  results+=("$(printf '%-28s exit %-3d %4d s   %s' "$name" "$rc" $((SECONDS - t0)) "$line")")
  return $rc
}

py=${KILN_PYTHON:-python3}
if [ -d .gpu-debs ]; then
  mkdir -p "$deps"
  for f in .gpu-debs/*.deb; do dpkg -x "$f" "$deps"; done
  for w in .gpu-debs/pybind11-*.whl; do
    [ -f "$w" ] && "$py" -m zipfile -e "$w" "$deps/pybind11" &&
      export KILN_PYBIND11_DIR=$deps/pybind11/pybind11/share/cmake/pybind11
  done
fi
# The unpacked .pc files say prefix=/usr: the sysroot puts their paths under $deps.
export PKG_CONFIG_SYSROOT_DIR=$deps
export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KILN_PREFIX_PATH=$deps/usr

KEY="distributed backends" step configure tools/configure_cuda.sh "$b" "$py" -DKILN_WITH_IMAGE=OFF &&
step build cmake --build "$b" -j "$(nproc)" &&
{
  KEY="tests passed" step ctest bash -c "cd '$b' && ctest -j 8 --output-on-failure"
  KEY="test cases|All tests passed" step cuda-tests "$b/tests/train/kiln_train_tests" "[cuda]"
  # The loader onto the GPU (side-stream copies) against the memcpy and
  # pinned host-to-device floors, on a synthetic 3x224x224 float16 cache.
  rm -rf /tmp/kiln-gpu-cache
  step synth-cache "$b/tests/kiln_synth_cache" /tmp/kiln-gpu-cache 4000 3 224 224 float16 &&
  {
    KEY="loader / floor" step bench-cuda "$b/kiln" bench /tmp/kiln-gpu-cache --device cuda --batch 256 --workers 4
    KEY="loader / floor" step bench-cpu "$b/kiln" bench /tmp/kiln-gpu-cache --batch 256 --workers 4
    # Training on the GPU from that cache: mixed precision (auto: bf16 on
    # an H200), the fp16 loss scaler, and the automatic batch size, each
    # with the data-stall share on its last line.
    train=("$b/kiln" train --data /tmp/kiln-gpu-cache --model resnet50 --device cuda --workers 4
           --channels-last --log-every 8)
    step train-auto "${train[@]}" --precision auto --batch-size 256 --epochs 2 --metrics "$out/train-auto.jsonl"
    step train-fp16 "${train[@]}" --precision fp16 --batch-size 256 --epochs 1
    step train-batch-auto "${train[@]}" --precision auto --batch-size auto --epochs 1
    # Two ranks over NCCL on this machine's one GPU (both --device cuda:0:
    # LOCAL_RANK 1 would mean cuda:1). NCCL may refuse two ranks on one GPU;
    # the last line says which happened.
    step nccl-2-ranks tools/gpu_two_ranks.sh "$b/kiln" /tmp/kiln-gpu-cache "$out"
    # Every batch intact on the GPU: 2,000 through kiln.Loader(device="cuda")
    # and 2,000 through pin_memory + non_blocking copies held up by a sleep
    # kernel, each compared with the same batch read on the CPU.
    if ls "$b"/python/kiln/_kiln*.so >/dev/null 2>&1; then
      KEY="batches" step python-stress env PYTHONPATH="$b/python" "$py" tools/gpu_loader_stress.py \
        /tmp/kiln-gpu-cache 2000 cuda
    else
      results+=("python-stress: not run: the module was not built (no Python headers, or the pybind11 wheel missing from .gpu-debs)")
    fi
    # kiln train against the tuned Python loop of bench/train_parity.py (issue 26):
    # resnet18, batch 128, bf16, SGD one-cycle, 3 epochs of that cache, interleaved
    # kiln, python, kiln, python. Python reads the cache with kiln.Loader where the
    # module was built here; else it trains on random batches made once on the GPU
    # (a loader that costs nothing: the comparison then favours Python).
    loader=device
    PYTHONPATH=$b/python "$py" -c 'import kiln' 2>/dev/null && loader=kiln
    for r in 1 2; do
      step parity-kiln-$r "$b/kiln" train --data /tmp/kiln-gpu-cache --model resnet18 --device cuda \
        --workers 4 --batch-size 128 --precision bf16 --epochs 3 --log-every 0 --optimizer sgd \
        --lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4 --schedule onecycle \
        --metrics "$out/parity-kiln-$r.jsonl"
      step parity-python-$r env PYTHONPATH="$b/python" "$py" bench/train_parity.py train resnet18 \
        --cache /tmp/kiln-gpu-cache --val-cache /tmp/kiln-gpu-cache --loader $loader --device cuda \
        --precision bf16 --epochs 3 --workers 4
    done
    step parity-ratio "$py" - "$out" "$loader" <<'EOF'
import json, os, sys
out, loader = sys.argv[1:]
def rate(lines):  # samples/s over all epochs of one run
    ep = [json.loads(l) for l in lines if l.startswith("{") and '"kind":"step"' not in l]
    return sum(e["samples_per_s"] * e["seconds"] for e in ep) / sum(e["seconds"] for e in ep)
k = [rate(open(os.path.join(out, "parity-kiln-%d.jsonl" % r))) for r in (1, 2)]
p = [rate(open(os.path.join(out, "parity-python-%d.log" % r))) for r in (1, 2)]
print("resnet18 bf16 cuda: kiln train %.0f samples/s, python-tuned (%s) %.0f, ratio %.2f "
      "(rounds %s)" % (sum(k) / 2, loader, sum(p) / 2, sum(k) / sum(p),
                       ", ".join("%.2f" % (a / b) for a, b in zip(k, p))))
EOF
  }
  step nvidia-smi nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
}

for f in bench-cuda bench-cpu; do  # the floors the benchmarks measured
  [ -f "$out/$f.log" ] && grep -E "floor|epoch" "$out/$f.log" | sed "s/^ */$f: /"
done
echo "== gpu_check: $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for r in "${results[@]}"; do echo "$r"; done
echo "logs: $out"
