#!/usr/bin/python3
"""One side of bench/append_bench.sh: kiln.write_dataset of a slice of the
bench corpus, timed.

usage: append_bench.py full|base|append SRC OUT N_BASE [workers=2]
  full    all the corpus's images (sorted by class, then file) into a new cache
  base    the first N_BASE of them into a new cache (the cache an append grows)
  append  the images after the first N_BASE, appended to the cache at OUT
Each image is decoded by PIL and stored whole as uint8 (3, H, W) with its longer
side at most 256 (PIL's reduce + resize, as a user's dataset would), with its
class index. Prints: kiln_append side=SIDE images=N seconds=S images_per_s=R
"""
import os
import sys
import time

import numpy as np


class Slice:
    """The corpus's images [lo, hi) in ImageFolder order, as kiln fields."""

    def __init__(self, src, lo, hi):
        self.classes = sorted(os.listdir(src))
        items = [(os.path.join(src, c, f), i) for i, c in enumerate(self.classes)
                 for f in sorted(os.listdir(os.path.join(src, c)))]
        self.items = items[lo:hi]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image
        path, label = self.items[i]
        with Image.open(path) as im:
            im.draft("RGB", (256, 256))
            im = im.convert("RGB")
            scale = 256 / max(im.size)
            if scale < 1:
                im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))),
                               Image.BILINEAR)
            x = np.asarray(im).transpose(2, 0, 1)
        return {"image": np.ascontiguousarray(x), "label": label}


def main():
    side, src, out, n_base = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    import kiln
    total = len(Slice(src, 0, None))
    lo, hi = {"full": (0, total), "base": (0, n_base), "append": (n_base, total)}[side]
    data = Slice(src, lo, hi)
    fields = {"image": kiln.Field("uint8", (3, None, None)), "label": kiln.Field("int64", ())}
    t0 = time.perf_counter()
    m = kiln.write_dataset(data, out, fields, workers=workers, progress=False,
                           append=side == "append", classes=data.classes,
                           mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dt = time.perf_counter() - t0
    want = total if side != "base" else n_base
    if m["count"] != want:
        sys.exit("append_bench: %s wrote %d records, expected %d" % (side, m["count"], want))
    print("kiln_append side=%s images=%d seconds=%.3f images_per_s=%.1f"
          % (side, len(data), dt, len(data) / dt))


if __name__ == "__main__":
    main()
