#!/usr/bin/python3
"""Compares kiln's Resize + CenterCrop with torchvision's on real photographs.

Usage: fidelity_check.py [--dump-bin PATH] [--resize 256] [--crop 224]
                         [--with-dct] PHOTO_DIR_OR_FILES...

For each image, runs `kiln_resize_dump IMAGE RESIZE CROP OUT.raw` (kiln's
decode + PIL-compatible resize + crop, uint8 HWC RGB) and compares it with
torchvision's `CenterCrop(C)(Resize(S)(PIL.Image.open(p).convert('RGB')))`.
Prints per-image MAE (0-255 scale), max error and the share of values off by
more than 8, then the overall figures. Exit status 1 when an image or the
whole set exceeds the bounds (MAE <= 0.5, <= 0.1% of values off by > 8), 2
on a usage or tool error.

--with-dct also upscales the first inputs with PIL to large JPEGs in a temp
dir (1100x900: too small for DCT scaling with kiln's 2x margin; 2400x1800:
1/2; 4000x3000: 1/4) and checks both the
full-size decode and kiln's DCT-downscaled decode (`--dct`) of every JPEG.
The DCT rows are held to the same bounds.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image
import torchvision.transforms as T

MAE_BOUND = 0.5
OFF8_BOUND = 0.1  # percent
EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def list_inputs(paths):
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, f) for f in os.listdir(p)
                          if os.path.splitext(f)[1].lower() in EXTS)
        else:
            out.append(p)
    return out


def kiln_result(dump_bin, path, resize, crop, dct, tmp):
    raw = os.path.join(tmp, "out.raw")
    cmd = [dump_bin, path, str(resize), str(crop), raw] + (["--dct"] if dct else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    w, h, scale = r.stdout.split()
    data = np.fromfile(raw, dtype=np.uint8)
    return data.reshape(int(h), int(w), 3), scale


def torchvision_result(path, resize, crop):
    img = Image.open(path).convert("RGB")
    return np.asarray(T.CenterCrop(crop)(T.Resize(resize)(img)))


def make_large_jpegs(sources, tmp):
    """Upscaled JPEG copies that trigger DCT-domain downscaling."""
    out = []
    for i, src in enumerate(sources[:3]):
        img = Image.open(src).convert("RGB")
        base = os.path.splitext(os.path.basename(src))[0]
        for size in ((1100, 900), (2400, 1800), (4000, 3000)):
            p = os.path.join(tmp, f"{base}_{size[0]}x{size[1]}.jpg")
            img.resize(size, Image.BICUBIC).save(p, quality=90)
            out.append(p)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump-bin", default="build/tests/image/kiln_resize_dump")
    ap.add_argument("--resize", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--with-dct", action="store_true")
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    if not os.access(args.dump_bin, os.X_OK):
        print(f"fidelity_check: {args.dump_bin} is not an executable (--dump-bin)", file=sys.stderr)
        return 2
    inputs = list_inputs(args.inputs)
    if not inputs:
        print("fidelity_check: no images found", file=sys.stderr)
        return 2

    failed = False
    totals = {}  # mode -> [abs error sum, values, off-by->8 count, max]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(p, "full") for p in inputs]
        if args.with_dct:
            large = make_large_jpegs(inputs, tmp)
            jpegs = [p for p in inputs if p.lower().endswith((".jpg", ".jpeg"))] + large
            jobs += [(p, "full") for p in large] + [(p, "dct") for p in jpegs]
        print(f"{'image':<34} {'mode':<4} {'scale':>5} {'size':>9} {'MAE':>7} {'max':>4} {'%>8':>7}")
        for path, mode in jobs:
            try:
                ours, scale = kiln_result(args.dump_bin, path, args.resize, args.crop,
                                          mode == "dct", tmp)
            except (RuntimeError, ValueError) as e:
                print(f"fidelity_check: {e}", file=sys.stderr)
                return 2
            ref = torchvision_result(path, args.resize, args.crop)
            if ours.shape != ref.shape:
                print(f"{path}: shape {ours.shape} != torchvision {ref.shape}")
                failed = True
                continue
            diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
            mae, mx = diff.mean(), int(diff.max())
            off8 = int((diff > 8).sum())
            pct = 100.0 * off8 / diff.size
            w, h = Image.open(path).size
            bad = mae > MAE_BOUND or pct > OFF8_BOUND
            failed |= bad
            print(f"{os.path.basename(path):<34} {mode:<4} {scale:>5} {f'{w}x{h}':>9} "
                  f"{mae:7.4f} {mx:4d} {pct:7.4f}{'  EXCEEDS BOUNDS' if bad else ''}")
            key = mode if mode == "full" else f"dct {scale}"
            t = totals.setdefault(key, [0.0, 0, 0, 0])
            t[0] += float(diff.sum())
            t[1] += diff.size
            t[2] += off8
            t[3] = max(t[3], mx)
    print()
    for key, (s, n, off8, mx) in sorted(totals.items()):
        mae, pct = s / n, 100.0 * off8 / n
        bad = mae > MAE_BOUND or pct > OFF8_BOUND
        failed |= bad
        print(f"overall {key:<8}: MAE {mae:.4f}  max {mx}  % off by >8 {pct:.4f}"
              f"{'  EXCEEDS BOUNDS' if bad else ''}")
    print(f"bounds: MAE <= {MAE_BOUND}, % off by >8 <= {OFF8_BOUND}: "
          f"{'FAILED' if failed else 'passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
