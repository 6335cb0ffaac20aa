#!/usr/bin/env python3
"""kiln's side of bench/peers_bench.sh: one epoch of kiln.Loader over a cache
built with `kiln build SRC CACHE --max-side 256 --dtype uint8 --norm imagenet`
(the Python module kiln must be on PYTHONPATH, for the python it was built for).

usage: peers_bench_kiln.py epoch CACHE rrc|center [workers=2] [batch=256]
  rrc:    kiln.Loader(CACHE, batch_size=batch, shuffle=True,
          crop=kiln.RandomResizedCrop(224), flip=True, workers=workers,
          dtype=torch.float16)
  center: kiln.Loader(CACHE, batch_size=batch, shuffle=False,
          crop=kiln.ResizeCenterCrop(256, 224), workers=workers,
          dtype=torch.float16)
dtype=torch.float16 with no device: the C++ workers write float16 batches
normalized with the cache's mean/std (ImageNet's: --norm imagenet) in the
same pass as the crop. Timed like the peers (bench/peers/peer_common.py
timed_epoch): from before the Loader is made (its ring allocated, its
threads started) to the end of the first epoch; the first batch is checked
to be float16 (B, 3, 224, 224) and normalized.
Prints: kiln_epoch mode=M images=N seconds=S images_per_s=R
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import peer_common as pc  # noqa: E402

USAGE = "usage: peers_bench_kiln.py epoch CACHE rrc|center [workers=2] [batch=256]"


def main():
    a = sys.argv[1:]
    if not a or a[0] != "epoch":
        sys.exit(USAGE)
    cache, mode, workers, batch = pc.epoch_args(a, USAGE)
    import kiln
    import torch
    if mode == "rrc":
        geometry = dict(shuffle=True, crop=kiln.RandomResizedCrop(pc.CROP), flip=True)
    else:
        geometry = dict(shuffle=False, crop=kiln.ResizeCenterCrop(pc.RESIZE, pc.CROP))
    pc.timed_epoch("kiln", mode, batch, lambda: kiln.Loader(
        cache, batch_size=batch, workers=workers, dtype=torch.float16, **geometry))


if __name__ == "__main__":
    main()
