#!/usr/bin/python3
"""Regenerate kiln's committed sample dataset.

Usage (needs Debian's python3 with python3-numpy, python3-pil, python3-skimage
and the dataset-fashion-mnist package installed):

    /usr/bin/python3 tools/make_sample_data.py [OUT_DIR=sample_data]

Writes
  OUT/fashion/train/<class>/<NNNNN>.png  first 30 images of each class from
                                          Fashion-MNIST train (NNNNN = index
                                          in the source IDX file)
  OUT/fashion/val/<class>/<NNNNN>.png    first 10 images of each class from
                                          Fashion-MNIST t10k
  OUT/photos/<name>.jpg                  real photographs from scikit-image's
                                          bundled data, JPEG quality 90

The output is byte-for-byte deterministic: no randomness is used, PNG/JPEG
files are written without any metadata (no timestamps, text chunks, EXIF,
ICC profiles or dpi), and files are written in a fixed order.  The script
deletes OUT/fashion and OUT/photos before writing so that stale files cannot
survive; anything else in OUT (e.g. OUT/README) is left alone.
"""

import gzip
import os
import shutil
import sys

import numpy as np
from PIL import Image
import skimage

FASHION_DIR = "/usr/share/datasets/fashion-mnist"

# Prefixed with the label so that sorted folder names give label order 0..9.
CLASS_NAMES = [
    "0_tshirt_top",
    "1_trouser",
    "2_pullover",
    "3_dress",
    "4_coat",
    "5_sandal",
    "6_shirt",
    "7_sneaker",
    "8_bag",
    "9_ankle_boot",
]

PER_CLASS = {"train": 30, "val": 10}
SOURCE_PREFIX = {"train": "train", "val": "t10k"}

# (source file in skimage's data dir, output name).  Only images whose
# scikit-image docstring states a licence that allows redistribution
# (public domain or CC0); see sample_data/README.
PHOTOS = [
    ("astronaut.png", "astronaut"),                  # 512x512 RGB, NASA, public domain
    ("camera.png", "camera"),                        # 512x512 gray, CC0 (Lav Varshney)
    ("chelsea.png", "chelsea"),                      # 451x300 RGB, CC0 (Stefan van der Walt)
    ("coffee.png", "coffee"),                        # 600x400 RGB, CC0 (Rachel Michetti)
    ("hubble_deep_field.jpg", "hubble_deep_field"),  # 1000x872 RGB, NASA, public domain
    ("retina.jpg", "retina"),                        # 1411x1411 RGB, CC0 (Mikael Haggstrom)
    ("rocket.jpg", "rocket"),                        # 640x427 RGB, SpaceX, public domain
]

JPEG_QUALITY = 90
# 4:4:4 (no chroma subsampling): decoders differ in how they upsample
# subsampled chroma, which would pollute resize-fidelity comparisons.
JPEG_SUBSAMPLING = 0

MAX_TOTAL_BYTES = 5 * 1000 * 1000


def read_idx(path):
    """Parse a gzip'ed IDX file (http://yann.lecun.com/exdb/mnist/)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != 0x08:  # only unsigned byte is used by (Fashion-)MNIST
        raise ValueError(f"{path}: unsupported IDX element type 0x{dtype_code:02x}")
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(dims))
    if len(data) != header + count:
        raise ValueError(f"{path}: size {len(data)} does not match dims {dims}")
    return np.frombuffer(data, dtype=np.uint8, count=count, offset=header).reshape(dims)


def save_png(arr, path):
    img = Image.fromarray(np.ascontiguousarray(arr), mode="L")
    # No pnginfo, dpi or icc_profile -> no ancillary chunks, no timestamps.
    img.save(path, format="PNG", optimize=False, compress_level=9)


def write_fashion(out):
    for split in ("train", "val"):
        prefix = SOURCE_PREFIX[split]
        images = read_idx(os.path.join(FASHION_DIR, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(FASHION_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise ValueError(f"unexpected image shape {images.shape}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels {labels.shape} do not match images {images.shape}")
        n = PER_CLASS[split]
        for label, name in enumerate(CLASS_NAMES):
            idx = np.flatnonzero(labels == label)[:n]
            if len(idx) != n:
                raise ValueError(f"{split}: only {len(idx)} images of class {label}")
            d = os.path.join(out, "fashion", split, name)
            os.makedirs(d, exist_ok=True)
            for i in idx:
                save_png(images[i], os.path.join(d, f"{int(i):05d}.png"))


def write_photos(out):
    src_dir = os.path.join(os.path.dirname(skimage.__file__), "data")
    d = os.path.join(out, "photos")
    os.makedirs(d, exist_ok=True)
    for src, name in PHOTOS:
        with Image.open(os.path.join(src_dir, src)) as im:
            im.load()
            # None of the sources carries a non-identity EXIF orientation;
            # refuse rather than silently write a rotated/unrotated image.
            orient = im.getexif().get(0x0112, 1)
            if orient != 1:
                raise ValueError(f"{src}: EXIF orientation {orient}")
            if im.mode not in ("L", "RGB"):
                im = im.convert("RGB")
            # Copy pixels into a fresh image so that no metadata
            # (ICC profile, EXIF, comments, dpi) is carried over.
            clean = Image.frombytes(im.mode, im.size, im.tobytes())
        clean.save(
            os.path.join(d, f"{name}.jpg"),
            format="JPEG",
            quality=JPEG_QUALITY,
            subsampling=JPEG_SUBSAMPLING,
            optimize=False,
            progressive=False,
        )


def total_size(out):
    total = 0
    for root, _, files in os.walk(out):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def main(argv):
    if len(argv) > 2:
        sys.exit(__doc__)
    out = argv[1] if len(argv) == 2 else "sample_data"
    for sub in ("fashion", "photos"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    write_fashion(out)
    write_photos(out)
    size = total_size(out)
    print(f"wrote {out}: {size} bytes")
    if size >= MAX_TOTAL_BYTES:
        sys.exit(f"error: {out} is {size} bytes, over the {MAX_TOTAL_BYTES} byte budget")


if __name__ == "__main__":
    main(sys.argv)
