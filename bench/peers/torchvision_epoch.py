#!/usr/bin/python3
"""Peer for kiln bench: one shuffled epoch of torchvision ImageFolder +
DataLoader (batch 64) over the raw images - what every epoch costs without a
preprocessed cache.
  eval (default): Resize(256), CenterCrop(224)
  rrc:            RandomResizedCrop(224), RandomHorizontalFlip (training recipe)
then ToTensor + ImageNet Normalize. limit > 0 keeps only the first limit images.
usage: torchvision_epoch.py ROOT [workers=2] [limit=0] [eval|rrc]
Prints: torchvision_epoch mode=M images=N seconds=S images_per_s=R
"""
import sys
import time

import torchvision.transforms as T
from torch.utils.data import DataLoader, Subset
from torchvision.datasets import ImageFolder

a = sys.argv[1:]
if not a or len(a) > 4 or (len(a) > 3 and a[3] not in ("eval", "rrc")):
    sys.exit(__doc__.strip().splitlines()[-2])
root = a[0]
workers = int(a[1]) if len(a) > 1 else 2
limit = int(a[2]) if len(a) > 2 else 0
mode = a[3] if len(a) > 3 else "eval"

if mode == "rrc":
    geometry = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
else:
    geometry = [T.Resize(256), T.CenterCrop(224)]
tensor = [T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
ds = ImageFolder(root, T.Compose(geometry + tensor))
if limit:
    ds = Subset(ds, range(min(limit, len(ds))))

loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
t0, n = time.time(), 0
for x, _ in loader:          # timed: worker start-up included
    n += len(x)
dt = time.time() - t0
print(f"torchvision_epoch mode={mode} images={n} seconds={dt:.2f} images_per_s={n / dt:.1f}")
