#!/usr/bin/python3
"""Peer for kiln build / kiln bench: the 'preprocess once into LMDB' a Python
user would write by hand with PIL + python-lmdb.

  build SRC OUT [procs=2]  every image of the ImageFolder tree SRC, resized
                           (shorter side 256, bilinear), center-cropped to 224,
                           ImageNet-normalized, stored as float16 3x224x224
                           bytes + label (pickled) under key %08d in the LMDB
                           OUT; decoding in a Pool of procs, one write txn.
                           Prints: pylmdb_build images=N seconds=S images_per_s=R
  read OUT [workers=2]     one shuffled epoch of OUT through a torch DataLoader
                           (batch 64). Prints: pylmdb_read images=N seconds=S images_per_s=R
prep(path) is also used by bench/write_dataset_bench.py (same bytes per image).
"""
import os
import pickle
import sys
import time

import numpy as np

SIDE, CROP = 256, 224
MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def prep(path):
    """One image -> float16 CHW bytes, normalized."""
    from PIL import Image
    im = Image.open(path).convert("RGB")
    f = SIDE / min(im.size)
    im = im.resize(tuple(max(SIDE, round(s * f)) for s in im.size), Image.BILINEAR)
    x0, y0 = (im.width - CROP) // 2, (im.height - CROP) // 2
    im = im.crop((x0, y0, x0 + CROP, y0 + CROP))
    chw = np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0
    return ((chw - MEAN) / STD).astype(np.float16).tobytes()


def listing(src):
    """(path, label) in ImageFolder order: sorted classes, sorted files."""
    classes = sorted(os.listdir(src))
    return [(os.path.join(src, c, f), label) for label, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(src, c)))]


def build(src, out, procs):
    import lmdb
    from multiprocessing import Pool
    items = listing(src)
    # a 1 TiB sparse map, write-mapped, no fsync until the end: the fast settings
    env = lmdb.open(out, map_size=1 << 40, writemap=True, sync=False)
    t0 = time.time()
    with Pool(procs) as pool, env.begin(write=True) as txn:
        blobs = pool.imap(prep, [p for p, _ in items], chunksize=16)
        for i, (blob, (_, label)) in enumerate(zip(blobs, items)):
            txn.put(b"%08d" % i, pickle.dumps((blob, label)))
    env.sync()
    dt = time.time() - t0
    print(f"pylmdb_build images={len(items)} seconds={dt:.2f} images_per_s={len(items) / dt:.1f}")


class CacheSet:
    """Map-style dataset over the LMDB; each worker opens its own environment."""

    def __init__(self, path):
        import lmdb
        self.path, self.env = path, None
        with lmdb.open(path, readonly=True, lock=False) as e:
            self.n = e.stat()["entries"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import lmdb
        import torch
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            blob, label = pickle.loads(txn.get(b"%08d" % i))
        return torch.frombuffer(bytearray(blob), dtype=torch.float16).view(3, CROP, CROP), label


def read(out, workers):
    from torch.utils.data import DataLoader
    loader = DataLoader(CacheSet(out), batch_size=64, shuffle=True, num_workers=workers)
    t0, n = time.time(), 0
    for x, _ in loader:      # timed: worker start-up included, as a user pays it
        n += len(x)
    dt = time.time() - t0
    print(f"pylmdb_read images={n} seconds={dt:.2f} images_per_s={n / dt:.1f}")


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "build":
        build(a[1], a[2], int(a[3]) if len(a) > 3 else 2)
    elif len(a) >= 2 and a[0] == "read":
        read(a[1], int(a[2]) if len(a) > 2 else 2)
    else:
        sys.exit("usage: pylmdb_cache.py build SRC OUT [procs=2] | read OUT [workers=2]")
