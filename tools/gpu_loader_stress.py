#!/usr/bin/env python3
"""Every batch kiln.Loader hands to the GPU arrives intact (tools/gpu_check.sh).

usage: gpu_loader_stress.py CACHE [BATCHES=2000] [DEVICE=cuda]

Two ways a batch reaches the device, each for BATCHES batches, each batch
compared exactly with the same batch read on the CPU by a second loader
with the same settings (copy=True, so its slots never race):
  device   kiln.Loader(device=DEVICE): the loader's own side-stream copies;
  pinned   kiln.Loader(pin_memory=True) and x.to(DEVICE, non_blocking=True),
           with the current stream held up by a sleep kernel before each
           copy, so that the copy runs well after the next batch is taken:
           a slot refilled before its copy ran would show up as a mismatch.
DEVICE=cpu runs the comparisons without a GPU (no pinned memory, no race);
it checks this script. Prints one line per way and exits 1 on any mismatch.
"""
import sys
import time

import torch

import kiln


def reference(cache, kw):
    return kiln.Loader(cache, copy=True, **kw)


def epochs(loader, batches):
    """(epoch, x, y) for `batches` batches, epoch after epoch."""
    n, epoch = 0, 0
    while n < batches:
        loader.set_epoch(epoch)
        for x, y in loader:
            yield epoch, x, y
            n += 1
            if n == batches:
                return
        epoch += 1


def check(name, got_loader, batches, cache, kw, to_device):
    """Compares each batch one batch late: after the next batch was taken,
    which is when a slot handed back too early would be refilled."""
    want = epochs(reference(cache, kw), batches)
    bad = n = 0
    t0 = time.monotonic()

    def compare(k, e, x, y, we, wx, wy):
        if e != we or not torch.equal(x.cpu(), wx) or not torch.equal(y.cpu(), wy):
            if bad < 5:
                print("  %s: batch %d (epoch %d) differs from the CPU's" % (name, k, e))
            return 1
        return 0

    prev = None
    for (e, x, y), (we, wx, wy) in zip(epochs(got_loader, batches), want):
        x, y = to_device(x, y)
        if prev is not None:
            bad += compare(*prev)
        prev = (n, e, x, y, we, wx, wy)
        n += 1
    if prev is not None:
        bad += compare(*prev)
    print("%-7s %d batches, %d differ from the CPU's (%.1f s)" % (name, n, bad, time.monotonic() - t0))
    return bad == 0 and n == batches


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    cache = sys.argv[1]
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    device = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cuda")
    kw = dict(batch_size=64, shuffle=True, seed=7, crop=200, flip=True, workers=4)
    ok = check("device", kiln.Loader(cache, device=device, **kw), batches, cache, kw,
               lambda x, y: (x, y))
    if device.type == "cuda":
        def late_copy(x, y):
            torch.cuda._sleep(2_000_000)  # the copy below waits for this kernel
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ok = check("pinned", kiln.Loader(cache, pin_memory=True, **kw), batches, cache, kw,
                   late_copy) and ok
    else:
        print("pinned  skipped: no CUDA device")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
