#!/usr/bin/python3
"""kiln's benchmark corpus: N ImageNet-like images in ImageFolder layout
(OUT/class_000 ... OUT/class_{K-1}), cut from a few real photographs.

Image i goes to class i % K. Each is a random crop (15-100 % of the photo's
area, aspect 3:4 to 4:3) of a randomly chosen photo, scaled so its shorter
side is 256-500 px (longer side capped at 800), mirrored half the time, and
saved as JPEG of quality 75-95; about 3 % are PNG and 2 % grayscale JPEG, so
that every decode path gets used. Same photos + N + K + seed = same files.

usage: make_corpus.py OUT N K PHOTO... [--seed S]
(bench/make_corpus.sh OUT [N] runs it on the photographs of python3-skimage.)
"""
import argparse
import os
import random
import sys

from PIL import Image


def load_photos(paths):
    """The photos as RGB, skipping any whose shorter side is under 256 px."""
    photos = [Image.open(p).convert("RGB") for p in paths]
    return [im for im in photos if min(im.size) >= 256]


def random_crop(im, rng):
    """A crop of random area and aspect ratio, clamped to the photo."""
    w, h = im.size
    area = rng.uniform(0.15, 1.0) * w * h
    aspect = rng.uniform(3 / 4, 4 / 3)
    cw = min(w, int(round((area * aspect) ** 0.5)))
    ch = min(h, int(round((area / aspect) ** 0.5)))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    return im.crop((x, y, x + cw, y + ch))


def rescale(im, rng):
    """Shorter side to a random 256-500 px, longer side at most 800 px."""
    w, h = im.size
    f = rng.randint(256, 500) / min(w, h)
    size = [max(1, round(w * f)), max(1, round(h * f))]
    if max(size) > 800:
        g = 800 / max(size)
        size = [max(1, round(s * g)) for s in size]
    return im.resize(tuple(size), Image.BILINEAR)


def make(out, n, k, photos, seed):
    # One RNG drives every choice, in a fixed order: the corpus is a pure
    # function of (photos, n, k, seed).
    rng = random.Random(seed)
    for c in range(k):
        os.makedirs(os.path.join(out, f"class_{c:03d}"), exist_ok=True)
    for i in range(n):
        im = rescale(random_crop(photos[rng.randrange(len(photos))], rng), rng)
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        stem = os.path.join(out, f"class_{i % k:03d}", f"img_{i:06d}")
        kind = rng.random()
        if kind < 0.03:                      # lossless: the PNG path
            im.save(stem + ".png")
        elif kind < 0.05:                    # one channel: the grayscale JPEG path
            im.convert("L").save(stem + ".jpg", quality=rng.randint(75, 95))
        else:
            im.save(stem + ".jpg", quality=rng.randint(75, 95))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int, help="number of class folders")
    ap.add_argument("photos", nargs="+")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    photos = load_photos(a.photos)
    if not photos:
        sys.exit("make_corpus.py: no usable photo (each needs a shorter side >= 256 px)")
    make(a.out, a.n, a.k, photos, a.seed)


if __name__ == "__main__":
    main()
