"""RandomResizedCrop at load time: kiln.Loader against a Python peer and the
memcpy floor of the same output bytes, interleaved in one run (issue 24).

usage: augment_bench.py WHOLE_CACHE JPEG_ROOT [--rounds 2] [--batch 256] [--workers 2]
       [--epochs 2] [--size 224]

WHOLE_CACHE: a kiln cache of whole uint8 images (kiln build --max-side 256
--dtype uint8); JPEG_ROOT: the ImageFolder it was built from. Per round, in
this order:
  A  kiln.Loader(crop=kiln.RandomResizedCrop(224), flip=True, dtype=torch.float16):
     normalized float16 batches, made by the C++ workers
  B  the same with uint8 output (the GPU path's input: normalize on the device)
  P  the peer: a torch DataLoader (same workers) over an LMDB of the same uint8
     images (written once from the cache by this script with python-lmdb, one
     record per image: shape and pixels), applying torchvision's
     RandomResizedCrop(224, antialias=True) + RandomHorizontalFlip + the
     cache's Normalize to tensors, output float16 (kiln's A output)
  F  the floor: memcpy of A's output bytes per batch into a ring of batch
     buffers, from a 512 MB source (larger than any CPU cache), with the same
     number of threads: what merely writing A's output costs
  T  torchvision ImageFolder + RandomResizedCrop(224) + flip + ToTensor +
     Normalize over the JPEGs (what users pay without a cache); first round only
Figures are samples/s of each run's best epoch (T: its one epoch); ratios use
the best run of each. Prints PASS/MISS against the issue's goals (A/P >= 4,
A/F >= 0.30). A benchmark, not a test: exits 0 whatever the figures.
"""
import argparse
import os
import threading
import time

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

import kiln


def kiln_epochs(cache, args, dtype):
    loader = kiln.Loader(cache, batch_size=args.batch, workers=args.workers,
                         crop=kiln.RandomResizedCrop(args.size), flip=True, dtype=dtype,
                         drop_last=True)
    best = 0.0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        n, t0 = 0, time.perf_counter()
        for x, _ in loader:
            n += x.shape[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def write_peer_lmdb(cache, path):
    """The peer's store: the cache's uint8 images, one LMDB record each
    (int32 C, H, W, int64 label, then the CHW pixels)."""
    if os.path.exists(os.path.join(path, "done")):
        return
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=1 << 34, subdir=True)
    with env.begin(write=True) as txn:
        for i in range(len(cache)):
            r = cache[i]
            img = np.ascontiguousarray(r["image"])
            head = np.array(img.shape, dtype=np.int32).tobytes() + \
                np.array([int(r["label"])], dtype=np.int64).tobytes()
            txn.put(b"%08d" % i, head + img.tobytes())
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
            c, h, w = np.frombuffer(v, dtype=np.int32, count=3)
            label = int(np.frombuffer(v, dtype=np.int64, count=1, offset=12)[0])
            x = torch.frombuffer(bytearray(v[20:20 + c * h * w]), dtype=torch.uint8)
        x = self.flip(self.crop(x.view(int(c), int(h), int(w))))
        return self.norm(x.float().div_(255)).half(), label


def peer_epochs(path, args, mean, std):
    ds = PeerDataset(path, args.size, mean, std)
    dl = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                    drop_last=True, persistent_workers=True)
    best = 0.0
    for _ in range(args.epochs):
        n, t0 = 0, time.perf_counter()
        for x, _ in dl:
            n += x.shape[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def memcpy_floor(sample_bytes, args, batches):
    """Samples/s of copying sample_bytes per sample, batch by batch, into a
    ring of 4 batch buffers with args.workers threads (numpy's copy releases
    the GIL), from a 512 MB source."""
    src = np.ones(512 << 20, dtype=np.uint8)
    batch_bytes = sample_bytes * args.batch
    ring = [np.zeros(batch_bytes, dtype=np.uint8) for _ in range(4)]
    per = (batch_bytes + args.workers - 1) // args.workers
    best = 0.0
    for _ in range(3):
        offset = [0]

        def work(k, b, off):
            lo, hi = k * per, min(batch_bytes, (k + 1) * per)
            np.copyto(ring[b % 4][lo:hi], src[off + lo:off + hi])

        t0 = time.perf_counter()
        for b in range(batches):
            off = offset[0]
            offset[0] = (off + batch_bytes) % (len(src) - batch_bytes)
            ts = [threading.Thread(target=work, args=(k, b, off)) for k in range(args.workers)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        best = max(best, batches * args.batch / (time.perf_counter() - t0))
    return best


def torchvision_epoch(root, args, mean, std):
    t = transforms.Compose([transforms.RandomResizedCrop(args.size), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize(mean, std)])
    dl = DataLoader(datasets.ImageFolder(root, t), batch_size=args.batch, shuffle=True,
                    num_workers=args.workers, drop_last=True)
    n, t0 = 0, time.perf_counter()
    for x, _ in dl:
        n += x.shape[0]
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("jpegs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--peer-lmdb", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # each side's parallelism is its workers
    cache = kiln.Cache(args.cache)
    mean, std = cache.normalization
    peer = args.peer_lmdb or args.cache.rstrip("/") + ".peer-lmdb"
    write_peer_lmdb(cache, peer)
    # Warm both stores.
    for p in (args.cache, peer):
        for f in os.listdir(p):
            if f.endswith(".mdb"):
                with open(os.path.join(p, f), "rb") as fh:
                    while fh.read(1 << 24):
                        pass
    sample_bytes = 3 * args.size * args.size * 2
    batches = len(cache) // args.batch
    runs = {"A": [], "B": [], "P": [], "F": []}
    load0 = os.getloadavg()[0]
    t_rate = None
    for r in range(args.rounds):
        runs["A"].append(kiln_epochs(cache, args, torch.float16))
        runs["B"].append(kiln_epochs(cache, args, None))
        runs["P"].append(peer_epochs(peer, args, mean, std))
        runs["F"].append(memcpy_floor(sample_bytes, args, batches))
        if r == 0:
            t_rate = torchvision_epoch(args.jpegs, args, mean, std)
        print("round %d: A kiln float16 %.0f, B kiln uint8 %.0f, P peer float16 %.0f, "
              "F memcpy floor %.0f samples/s" % (r + 1, runs["A"][-1], runs["B"][-1],
                                                 runs["P"][-1], runs["F"][-1]), flush=True)
    best = {k: max(v) for k, v in runs.items()}
    print("augment_bench: %d whole uint8 images, RandomResizedCrop(%d) + flip, batch %d, "
          "%d workers, %d rounds x %d epochs, load average %.2f -> %.2f"
          % (len(cache), args.size, args.batch, args.workers, args.rounds, args.epochs, load0,
             os.getloadavg()[0]))
    print("  torchvision ImageFolder over the JPEGs (round 1): %.0f samples/s" % t_rate)
    a = best["A"]
    print("  kiln float16 / peer          = %.2f  (goal >= 4: %s)"
          % (a / best["P"], "PASS" if a / best["P"] >= 4 else "MISS"))
    print("  kiln float16 / memcpy floor  = %.2f  (goal >= 0.30: %s, moonshot 0.5)"
          % (a / best["F"], "PASS" if a / best["F"] >= 0.30 else "MISS"))
    print("  kiln uint8 / memcpy floor of its bytes = %.2f" % (best["B"] / (2 * best["F"])))
    print("  kiln uint8 / kiln float16    = %.2f" % (best["B"] / a))
    print("  kiln float16 / torchvision ImageFolder = %.2f" % (a / t_rate))


if __name__ == "__main__":
    main()
