#!/usr/bin/python3
"""kiln.write_dataset over a Python dataset, timed: one side of
bench/write_dataset_bench.sh (which interleaves it with the Python PIL + lmdb
peer and prints the ratios).

usage: write_dataset_bench.py SIDE SRC OUT PEER_FILE [workers=2]
SIDE:
  imagefolder  torchvision ImageFolder(SRC) with Resize(256) + CenterCrop(224) +
               PILToTensor: uint8 3x224x224 records + int64 label (issue 23's figure)
  peer-prep    the peer's own per-image function (PEER_FILE's prep: the same PIL
               resize/crop and float16 normalization, the same bytes per image),
               as a dataset: float16 3x224x224 records + label - the same work and
               output as the peer, only the writing path differs
Prints one line: kiln_write side=SIDE images=N seconds=S images_per_s=R
"""
import importlib.util
import os
import sys
import time

import numpy as np


class PeerPrep:
    """ImageFolder's file list and labels, each image through the peer's prep()."""

    def __init__(self, src, peer_file):
        spec = importlib.util.spec_from_file_location("pylmdb_peer", peer_file)
        self.peer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.peer)
        classes = sorted(os.listdir(src))
        self.items = [(os.path.join(src, c, f), i) for i, c in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(src, c)))]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        x = np.frombuffer(self.peer.prep(path), np.float16).reshape(3, 224, 224)
        return {"image": x, "label": label}


class Folder:
    """torchvision's ImageFolder + Resize(256) + CenterCrop(224) + PILToTensor, as fields."""

    def __init__(self, src):
        from torchvision import datasets, transforms
        t = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                                transforms.PILToTensor()])
        self.ds = datasets.ImageFolder(src, transform=t)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return {"image": x.numpy(), "label": y}


def main():
    side, src, out, peer_file = sys.argv[1:5]
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    import kiln
    if side == "imagefolder":
        ds = Folder(src)
        fields = {"image": kiln.Field("uint8", (3, 224, 224)), "label": kiln.Field("int64", ())}
        extra = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    elif side == "peer-prep":
        ds = PeerPrep(src, peer_file)
        fields = {"image": kiln.Field("float16", (3, 224, 224)), "label": kiln.Field("int64", ())}
        extra = {}
    else:
        sys.exit("unknown side " + side)
    t0 = time.time()
    m = kiln.write_dataset(ds, out, fields, workers=workers, progress=False, resume=False,
                           recipe={"bench": side}, **extra)
    dt = time.time() - t0
    n = m["count"]
    assert n == len(ds), (n, len(ds))
    print("kiln_write side=%s images=%d seconds=%.2f images_per_s=%.1f" % (side, n, dt, n / dt))


if __name__ == "__main__":
    main()
