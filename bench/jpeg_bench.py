"""JPEG records (issue 39): kiln.Loader over a cache of JPEG records against
kiln.Loader over the raw uint8 cache of the same images and against a Python
peer that reads the same JPEG bytes from LMDB, interleaved in one run.

usage: jpeg_bench.py JPEG_CACHE RAW_CACHE [--rounds 2] [--batch 256] [--workers 2]
       [--epochs 2] [--size 224]

JPEG_CACHE: kiln build --max-side 256 --encode jpeg; RAW_CACHE: the same with
uint8 pixels. Per round, in this order, RandomResizedCrop(224) + flip to
float16 ImageNet-normalized (B, 3, 224, 224), batch 256, 2 workers, warm:
  J  kiln.Loader(JPEG_CACHE, crop=kiln.RandomResizedCrop(224), flip=True,
     dtype=torch.float16): the C++ workers decode each sample's box (DCT
     scaling on, the default) and crop, resize, flip and normalize it
  X  the same with dct_scaling=False (every sample PIL-exact)
  R  the same over RAW_CACHE (no decode)
  P  the peer: torch's DataLoader (same workers, persistent) over an LMDB
     (python-lmdb) holding the JPEG cache's own JPEG bytes (cache.read(i,
     decode=False)) and labels, each sample torchvision.io.decode_jpeg +
     RandomResizedCrop(224, antialias=True) + RandomHorizontalFlip +
     Normalize, float16: what a user who keeps JPEGs in LMDB writes
Figures: samples/s of each side's best epoch over all rounds. "decode share"
is 1 - J_time/R_time's complement: the share of J's time per sample that R
does not spend, (1/J - 1/R) / (1/J): what decoding costs in the fused pass.
A benchmark, not a test: exits 0 whatever the figures.
"""
import argparse
import os
import time

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import io, transforms

import kiln


def kiln_best(cache, args, **kw):
    loader = kiln.Loader(cache, batch_size=args.batch, workers=args.workers, drop_last=True,
                         crop=kiln.RandomResizedCrop(args.size), flip=True, dtype=torch.float16,
                         **kw)
    best = 0.0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        n, t0 = 0, time.perf_counter()
        for x, _ in loader:
            n += x.shape[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def write_peer_lmdb(cache, path):
    """The peer's store: the JPEG cache's stored JPEG bytes, one LMDB record
    each (int64 label, then the JPEG)."""
    if os.path.exists(os.path.join(path, "done")):
        return
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=1 << 34, subdir=True)
    with env.begin(write=True) as txn:
        for i in range(len(cache)):
            r = cache.read(i, decode=False)
            txn.put(b"%08d" % i, np.array([int(r["label"])], dtype=np.int64).tobytes()
                    + r["image"].tobytes())
    env.close()
    open(os.path.join(path, "done"), "w").close()


class PeerDataset(Dataset):
    def __init__(self, path, size, mean, std):
        self.path, self.env = path, None
        with lmdb.open(path, readonly=True, lock=False, subdir=True) as env:
            self.n = env.stat()["entries"]
        self.crop = transforms.RandomResizedCrop(size, antialias=True)
        self.flip = transforms.RandomHorizontalFlip()
        self.norm = transforms.Normalize(mean, std)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.env is None:  # opened in each worker
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False,
                                 subdir=True)
        with self.env.begin(buffers=True) as txn:
            v = txn.get(b"%08d" % i)
            label = int(np.frombuffer(v, dtype=np.int64, count=1)[0])
            data = torch.frombuffer(bytearray(v[8:]), dtype=torch.uint8)
        x = io.decode_jpeg(data, mode=io.ImageReadMode.RGB)
        x = self.flip(self.crop(x))
        return self.norm(x.float().div_(255)).half(), label


def peer_best(path, args, mean, std):
    dl = DataLoader(PeerDataset(path, args.size, mean, std), batch_size=args.batch, shuffle=True,
                    num_workers=args.workers, drop_last=True, persistent_workers=True)
    best = 0.0
    for _ in range(args.epochs):
        n, t0 = 0, time.perf_counter()
        for x, _ in dl:
            assert x.dtype == torch.float16 and tuple(x.shape[1:]) == (3, args.size, args.size)
            n += x.shape[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def warm(path):
    for f in os.listdir(path):
        if f.endswith(".mdb"):
            with open(os.path.join(path, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jpeg_cache")
    ap.add_argument("raw_cache")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    torch.set_num_threads(1)  # each side's parallelism is its workers
    jc, rc = kiln.Cache(args.jpeg_cache), kiln.Cache(args.raw_cache)
    assert jc.fields["image"].codec == "jpeg", jc.fields
    mean, std = jc.normalization
    peer = args.jpeg_cache.rstrip("/") + ".peer-lmdb"
    write_peer_lmdb(jc, peer)
    for p in (args.jpeg_cache, args.raw_cache, peer):
        warm(p)
    runs = {"J": [], "X": [], "R": [], "P": []}
    load0 = os.getloadavg()[0]
    for r in range(args.rounds):
        runs["J"].append(kiln_best(jc, args))
        runs["X"].append(kiln_best(jc, args, dct_scaling=False))
        runs["R"].append(kiln_best(rc, args))
        runs["P"].append(peer_best(peer, args, mean, std))
        print("round %d: J kiln JPEG %.0f, X kiln JPEG exact %.0f, R kiln raw %.0f, "
              "P peer %.0f samples/s" % (r + 1, runs["J"][-1], runs["X"][-1], runs["R"][-1],
                                         runs["P"][-1]), flush=True)
    b = {k: max(v) for k, v in runs.items()}
    print("jpeg_bench epochs: %d images, RandomResizedCrop(%d) + flip, float16, batch %d, %d "
          "workers, %d rounds x %d epochs, load average %.2f -> %.2f"
          % (len(jc), args.size, args.batch, args.workers, args.rounds, args.epochs, load0,
             os.getloadavg()[0]))
    print("  kiln JPEG / peer (decode_jpeg from LMDB)  = %.2f  (goal >= 3: %s)"
          % (b["J"] / b["P"], "PASS" if b["J"] / b["P"] >= 3 else "MISS"))
    print("  kiln JPEG exact (dct_scaling=False) / peer = %.2f" % (b["X"] / b["P"]))
    print("  kiln JPEG / kiln raw pixels               = %.2f" % (b["J"] / b["R"]))
    print("  decode share of kiln JPEG's time          = %.2f (exact: %.2f)"
          % ((1 / b["J"] - 1 / b["R"]) * b["J"], (1 / b["X"] - 1 / b["R"]) * b["X"]))


if __name__ == "__main__":
    main()
