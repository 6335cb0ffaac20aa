#!/usr/bin/env python3
"""Pillow-SIMD peer of bench/peers_bench.sh: torchvision's ImageFolder +
DataLoader over resized JPEG files, with Pillow-SIMD in place of Pillow (run
with the pillow-simd venv's python, whose PIL is Pillow-SIMD and whose torch
and torchvision are the peers venv's).

  convert SRC OUT [workers=2]
      every image of the ImageFolder tree SRC as OUT/<class>/<name>.jpg: the
      image resized so its longer side is at most 256, JPEG quality 90
      (peer_common.resized_jpeg, here run by Pillow-SIMD), in a Pool of
      `workers` processes - the usual "make a small copy of ImageNet" step.
      Prints: pillow_simd_convert images=N seconds=S images_per_s=R bytes=B
  epoch OUT rrc|center [workers=2] [batch=256]
      one epoch of torchvision.datasets.ImageFolder(OUT, peer_common.transform)
      through torch's DataLoader(batch_size=batch, shuffle=(rrc),
      num_workers=workers): PIL decodes, the v2 transforms crop and resize
      the PIL image (Pillow-SIMD's resize), then tensor, normalize, float16.
      Prints: pillow_simd_epoch mode=M images=N seconds=S images_per_s=R

Configuration, from Pillow-SIMD's README (github.com/uploadcare/pillow-simd,
its PyPI page pypi.org/project/Pillow-SIMD): installed instead of Pillow
(pip uninstall pillow; then the sdist built with CC="cc -mavx2", since only
AVX2 builds get its fastest code paths, and the machine has AVX2); nothing
else changes in the user's code. The DataLoader gets the same 2 workers as
every side.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

USAGE = "usage: pillow_simd_peer.py convert SRC OUT [workers=2] | epoch OUT rrc|center [workers=2] [batch=256]"


def require_simd():
    import PIL
    if ".post" not in PIL.__version__:
        sys.exit("pillow_simd_peer.py: PIL %s at %s is not Pillow-SIMD (whose versions end in .postN)"
                 % (PIL.__version__, PIL.__file__))


def write_one(job):
    src, dst = job
    with open(dst, "wb") as f:
        f.write(pc.resized_jpeg(src))


def convert(src, out, workers):
    from multiprocessing import Pool
    items = pc.listing(src)
    jobs = []
    for path, _ in items:
        cls = os.path.basename(os.path.dirname(path))
        os.makedirs(os.path.join(out, cls), exist_ok=True)
        jobs.append((path, os.path.join(out, cls, os.path.splitext(os.path.basename(path))[0] + ".jpg")))
    t0 = time.perf_counter()
    with Pool(workers) as pool:
        for _ in pool.imap_unordered(write_one, jobs, chunksize=16):
            pass
    dt = time.perf_counter() - t0
    print(f"pillow_simd_convert images={len(items)} seconds={dt:.3f} "
          f"images_per_s={len(items) / dt:.1f} bytes={pc.tree_bytes([out])}", flush=True)


def epoch(out, mode, workers, batch):
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    tf = pc.transform(mode)
    pc.timed_epoch("pillow_simd", mode, batch, lambda: DataLoader(
        ImageFolder(out, tf), batch_size=batch, shuffle=(mode == "rrc"), num_workers=workers))


if __name__ == "__main__":
    pc.peer_main(USAGE, convert, epoch, before=require_simd)
