#!/bin/bash
# kiln train as 2 ranks over NCCL on one machine's GPU 0 (tools/gpu_check.sh):
#   tools/gpu_two_ranks.sh KILN CACHE OUTDIR
# Each rank's log goes to OUTDIR/nccl-rankR.log. The last line printed says
# whether the two ranks trained, or that NCCL refuses two ranks on one GPU.
# KILN_TWO_RANKS_DEVICE and KILN_TWO_RANKS_MODEL (cuda:0, resnet18) change
# the device and model, to try the script on a machine without a GPU (cpu:
# Gloo).
set -u
kiln=$1 cache=$2 out=$3
device=${KILN_TWO_RANKS_DEVICE:-cuda:0} model=${KILN_TWO_RANKS_MODEL:-resnet18}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$kiln" train --data "$cache" --model "$model" --device "$device" --batch-size 64 --workers 2 \
    --epochs 1 --max-steps 20 --log-every 5 --dist-timeout 120 >"$out/nccl-rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out/nccl-rank0.log"
echo "--- rank 1:"
cat "$out/nccl-rank1.log"
joined=$(grep -o "rank 0 of 2 ([A-Za-z]* on [a-z0-9:]*" "$out/nccl-rank0.log" | head -1)
if [ $rc -eq 0 ] && [ -n "$joined" ]; then
  echo "two ranks trained, ${joined#rank 0 of 2 (}: $(grep -E "^epoch [0-9]+/|stopped after" "$out/nccl-rank0.log" | tail -1)"
elif grep -qE "Duplicate GPU|refused the group" "$out"/nccl-rank*.log; then
  echo "NCCL refuses two ranks on one GPU: LibTorch's NCCL does not allow this check here"
  exit 0
else
  echo "two ranks failed (exit $rc), see the logs above"
fi
exit $rc
