#!/usr/bin/python3
"""Shuffled epochs of a kiln cache read from Python, for python_loader_bench.sh.

usage: python_epochs.py module CACHE [--batch 256] [--workers 2] [--epochs 3]
       python_epochs.py kiln_torch CACHE [--batch 256] [--workers 2] [--epochs 2]

module:     kiln.Loader (the C++ loader through the Python module; PYTHONPATH
            must find it), the ring of workers + 2 slots, zero-copy batches.
kiln_torch: tools/kiln_torch.py's KilnDataset through torch's DataLoader
            (shuffle, `workers` worker processes, kept across epochs).

Each epoch is timed from iter() to the end of the epoch; the consumer touches
one label per batch (as `kiln bench` does). Prints one line per epoch,
  epoch E: R samples/s (S samples)
then, for `module`, the anonymous memory of this process (RssAnon, MB of
1e6 bytes) after the imports and before the loader (baseline), its peak while
the epochs ran (sampled every 4 batches and at each epoch's end), the ring's
size and what the loader holds beyond its ring:
  rss baseline_mb=B peak_mb=P ring_mb=R beyond_ring_mb=P-B-R
"""
import argparse
import os
import sys
import time


def rss_anon_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["module", "kiln_torch"])
    ap.add_argument("cache")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None)
    a = ap.parse_args()
    import torch  # noqa: F401  (both modes pay for it before the baseline)

    if a.mode == "module":
        import kiln
        epochs = a.epochs or 3
        base = rss_anon_mb()
        loader = kiln.Loader(a.cache, batch_size=a.batch, workers=a.workers, seed=1,
                             drop_last=False)
        ring = loader.ring_bytes / 1e6
        peak = rss_anon_mb()
        for e in range(epochs):
            t0 = time.perf_counter()
            seen, sink = 0, 0
            for i, (x, y) in enumerate(loader):
                sink += int(y[0])
                seen += x.shape[0]
                if i % 4 == 0:
                    peak = max(peak, rss_anon_mb())
            dt = time.perf_counter() - t0
            peak = max(peak, rss_anon_mb())
            print("epoch %d: %.0f samples/s (%d samples)" % (e, seen / dt, seen), flush=True)
        print("rss baseline_mb=%.1f peak_mb=%.1f ring_mb=%.1f beyond_ring_mb=%.1f"
              % (base, peak, ring, peak - base - ring))
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "tools"))
        from kiln_torch import KilnDataset
        epochs = a.epochs or 2
        ds = KilnDataset(a.cache)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                         num_workers=a.workers, persistent_workers=a.workers > 0)
        for e in range(epochs):
            t0 = time.perf_counter()
            seen, sink = 0, 0
            for x, y in dl:
                sink += int(y[0])
                seen += x.shape[0]
            dt = time.perf_counter() - t0
            print("epoch %d: %.0f samples/s (%d samples)" % (e, seen / dt, seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
