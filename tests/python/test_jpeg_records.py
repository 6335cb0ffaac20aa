"""JPEG records (kiln build --encode, kiln.Writer's Field(..., codec="jpeg")):
stored bytes, the loader's decode against PIL's decode + crop + resize for
the boxes the loader reports (exact at full scale, within the stated bound
with DCT scaling), the same batches for any number of workers, damage named,
never a signal.
Run as test_jpeg_records.py SYNTH DUMP_RECORDS DUMP_BATCHES CHECK
(module_common.py); needs KILN_BIN and KILN_SAMPLE_PHOTOS (kiln build)."""
import glob
import io
import os
import shutil
import subprocess
import sys

from module_common import SKIP, expect_raises, run

import kiln
import numpy as np
import torch
from PIL import Image
from test_augment import pil_rrc

KILN = os.environ.get("KILN_BIN")
PHOTOS = os.environ.get("KILN_SAMPLE_PHOTOS")


def need_build():
    if not (KILN and PHOTOS):
        print("SKIP: KILN_BIN or KILN_SAMPLE_PHOTOS unset")
        sys.exit(SKIP)


def jpeg_folder(tmp):
    """sample_data's JPEG photographs, as they are, in two class folders."""
    src = os.path.join(tmp, "src")
    for k, path in enumerate(sorted(glob.glob(os.path.join(PHOTOS, "*.jpg")))):
        d = os.path.join(src, "class_%d" % (k % 2))
        os.makedirs(d, exist_ok=True)
        shutil.copy(path, d)
    return src


def sources(src):
    return sorted(glob.glob(os.path.join(src, "*", "*.jpg")))


def build(src, out, *args):
    subprocess.run([KILN, "build", src, out, "--norm", "imagenet", "--progress", "none"]
                   + list(args), check=True, stdout=subprocess.DEVNULL)
    return kiln.Cache(out)


def pil_decode(data):
    """PIL's decode of JPEG bytes as uint8 (C, H, W): RGB, or L for grayscale."""
    im = Image.open(io.BytesIO(bytes(data)))
    im = im.convert("L" if im.mode == "L" else "RGB")
    a = np.asarray(im)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def loader_vs_pil(cache, dct_scaling, size=64, epochs=3):
    """(samples, worst mean |kiln - PIL|, exact samples) over a few epochs of
    RandomResizedCrop(size) + flip, uint8 out; PIL decodes each record's
    stored JPEG and crops + resizes it with the box the loader reports."""
    loader = kiln.Loader(cache, batch_size=2, crop=kiln.RandomResizedCrop(size), flip=True,
                         workers=2, seed=11, dct_scaling=dct_scaling)
    worst, exact, n = 0.0, 0, 0
    for epoch in range(epochs):
        order = loader.epoch_order(epoch)
        k = 0
        for x, _ in loader:
            boxes = loader.boxes()
            for j in range(x.shape[0]):
                idx = order[k]
                k += 1
                stored = cache.read(idx, decode=False)["image"]
                img = pil_decode(stored)
                if img.shape[0] == 1:
                    img = np.repeat(img, 3, axis=0)  # a 3-channel cache of a grey JPEG
                want = pil_rrc(img, boxes[j], size).astype(np.int32)
                got = x[j].numpy().astype(np.int32)
                err = float(np.abs(got - want).mean())
                worst = max(worst, err)
                exact += int(err == 0)
                n += 1
    return n, worst, exact


def check_passthrough_bytes_and_sizes(tmp):
    """--encode jpeg of JPEG sources that need no resize stores each file's
    own bytes (cache.read(decode=False) equals the file), which decode to
    the record's shape; --max-side 256 re-encodes, q90, into far fewer bytes
    than uint8 pixels; kiln verify (every level) passes both; inspect says
    the field is stored as jpeg."""
    need_build()
    src = jpeg_folder(tmp)
    files = sources(src)
    cache = build(src, os.path.join(tmp, "pass"), "--max-side", "100000", "--encode", "jpeg")
    assert cache.fields["image"].codec == "jpeg", cache.fields
    assert len(cache) == len(files)
    for i, path in enumerate(files):
        stored = cache.read(i, decode=False)["image"]
        with open(path, "rb") as f:
            assert stored.tobytes() == f.read(), path
        pixels = cache[i]["image"]
        want = pil_decode(stored)
        if want.shape[0] == 1:  # a grey JPEG in a 3-channel cache: PIL's convert("RGB")
            want = np.repeat(want, 3, axis=0)
        assert pixels.dtype == np.uint8 and np.array_equal(pixels, want), path
    small = build(src, os.path.join(tmp, "q90"), "--max-side", "256", "--encode", "jpeg:90")
    raw = build(src, os.path.join(tmp, "raw"), "--max-side", "256")
    def size(c):
        return sum(os.path.getsize(p) for p in glob.glob(os.path.join(c.path, "shard-*.mdb")))
    assert size(small) <= 0.25 * size(raw), (size(small), size(raw))
    for i in range(len(raw)):
        a, b = raw[i]["image"], small[i]["image"]
        assert a.shape == b.shape
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 4, i  # q90's loss
    for c in (cache, small):
        for level in ("quick", "full"):
            r = subprocess.run([KILN, "verify", c.path, "--level", level], capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stdout + r.stderr
    out = subprocess.run([KILN, "inspect", small.path], capture_output=True, text=True).stdout
    assert "stored as jpeg" in out, out


def check_loader_equals_pil(tmp):
    """dct_scaling=False: every sample equals PIL's decode of the stored JPEG,
    then crop(box).resize + flip (Pillow 13's bilinear), byte for byte. With
    DCT scaling (the default) every sample is within the stated bound of it
    (mean absolute error at most 3 of 255), and the boxes large enough to
    scale do differ from it."""
    need_build()
    src = jpeg_folder(tmp)
    cache = build(src, os.path.join(tmp, "pass"), "--max-side", "100000", "--encode", "jpeg")
    n, worst, exact = loader_vs_pil(cache, dct_scaling=False)
    assert n == 3 * len(cache) and exact == n, (n, exact, worst)
    n, worst, exact = loader_vs_pil(cache, dct_scaling=True)
    print("DCT scaling: %d of %d samples exact, worst mean error %.3f" % (exact, n, worst))
    assert worst <= 3.0, worst
    assert exact < n  # 64-pixel crops of 300-512 px photos: most boxes scale


def check_normalized_and_center(tmp):
    """float16 output is the uint8 output normalized with the manifest's
    mean/std (as for raw caches); ResizeCenterCrop works on a JPEG cache and
    equals the raw cache built from the same decoded pixels."""
    need_build()
    src = jpeg_folder(tmp)
    jp = build(src, os.path.join(tmp, "pass"), "--max-side", "100000", "--encode", "jpeg")
    raw = build(src, os.path.join(tmp, "raw"), "--max-side", "100000")
    for crop in (kiln.ResizeCenterCrop(96, 80), kiln.RandomResizedCrop(80)):
        a = kiln.Loader(jp, batch_size=3, crop=crop, flip=True, seed=2, shuffle=False,
                        dct_scaling=False)
        b = kiln.Loader(raw, batch_size=3, crop=crop, flip=True, seed=2, shuffle=False)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb)
            assert torch.equal(xa, xb), crop
        h = kiln.Loader(jp, batch_size=3, crop=crop, flip=True, seed=2, shuffle=False,
                        dct_scaling=False, dtype=torch.float16)
        u = kiln.Loader(jp, batch_size=3, crop=crop, flip=True, seed=2, shuffle=False,
                        dct_scaling=False)
        for (xh, _), (xu, _) in zip(h, u):
            assert xh.dtype == torch.float16
            # The workers' float16 of the same pixels (their own rounding of
            # (x / 255 - mean) / std: within a float16 step of kiln.normalize's).
            assert float((xh.float() - jp.normalize(xu)).abs().max()) < 1e-2


def check_same_batches_any_workers(tmp):
    """1 and 3 workers give the same batches from a JPEG cache."""
    need_build()
    src = jpeg_folder(tmp)
    cache = build(src, os.path.join(tmp, "q"), "--max-side", "200", "--encode", "jpeg")
    def batches(workers):
        l = kiln.Loader(cache, batch_size=2, crop=kiln.RandomResizedCrop(48), flip=True,
                        workers=workers, seed=4, dtype=torch.float16)
        return [(x.clone(), y.clone()) for x, y in l]
    one, three = batches(1), batches(3)
    assert len(one) == len(three)
    for (a, ya), (b, yb) in zip(one, three):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def check_damaged_jpeg_is_named(tmp):
    """A JPEG record damaged in its shard (an EOI marker written into its
    entropy-coded data): kiln verify names the record; the loader raises
    kiln.CorruptionError naming it (without verify=True, the decode fails);
    cache.read names it too; nothing dies of a signal."""
    need_build()
    src = jpeg_folder(tmp)
    out = os.path.join(tmp, "pass")
    cache = build(src, out, "--max-side", "100000", "--encode", "jpeg")
    files = sources(src)
    victim = 2
    with open(files[victim], "rb") as f:
        data = f.read()
    shard = glob.glob(os.path.join(out, "shard-*.mdb"))[0]
    with open(shard, "r+b") as f:
        blob = f.read()
        at = blob.find(data)
        assert at > 0
        f.seek(at + len(data) // 2)
        f.write(b"\xff\xd9" * 8)
    r = subprocess.run([KILN, "verify", out], capture_output=True, text=True)
    assert r.returncode == 1 and ("record %d" % victim) in r.stdout + r.stderr, r.stdout + r.stderr
    cache = kiln.Cache(out)
    loader = kiln.Loader(cache, batch_size=1, shuffle=False, crop=kiln.ResizeCenterCrop(64, 64),
                         dct_scaling=False)
    err = expect_raises(kiln.CorruptionError, lambda: [None for _ in loader], "record %d" % victim)
    assert "JPEG" in str(err), err
    expect_raises(kiln.CorruptionError, lambda: cache.read(victim), "record %d" % victim)
    assert cache.read(victim, decode=False)["image"].size == len(data)


def check_writer_jpeg_field(tmp):
    """kiln.Writer with Field("uint8", (3, None, None), "jpeg"): bytes are
    stored as given, a uint8 (3, H, W) array is encoded; both read back and
    load; bytes that are not a decodable JPEG, a colour JPEG for
    a 1-channel field and a wrong size for a fixed field are refused, naming
    the record and field; write_dataset stores the bytes its workers give."""
    need_build()
    path = os.path.join(tmp, "w")
    photos = sorted(glob.glob(os.path.join(PHOTOS, "*.jpg")))
    color = [p for p in photos if Image.open(p).mode == "RGB"]
    fields = {"image": kiln.Field("uint8", (3, None, None), "jpeg"), "label": kiln.Field("int64", ())}
    w = kiln.Writer(path, fields, mean=[0.5] * 3, std=[0.25] * 3)
    with open(color[0], "rb") as f:
        first = f.read()
    w.append({"image": first, "label": 0})
    arr = np.asarray(Image.open(color[1]).convert("RGB")).transpose(2, 0, 1).copy()
    w.append({"image": arr, "label": 1})
    expect_raises(ValueError, lambda: w.append({"image": b"\xff\xd8\xff not a jpeg", "label": 0}),
                  "field 'image'")
    expect_raises(ValueError, lambda: w.append({"image": first[: len(first) // 2], "label": 0}),
                  "record 2")
    w.close()
    c = kiln.Cache(path)
    assert c.fields["image"].codec == "jpeg"
    assert c.read(0, decode=False)["image"].tobytes() == first
    assert np.array_equal(c[0]["image"], pil_decode(first))
    back = c[1]["image"]
    assert back.shape == arr.shape and np.abs(back.astype(int) - arr.astype(int)).mean() < 4
    l = kiln.Loader(c, batch_size=2, crop=kiln.RandomResizedCrop(32), shuffle=False)
    xs = [x for x, _ in l]
    assert tuple(xs[0].shape) == (2, 3, 32, 32)
    r = subprocess.run([KILN, "verify", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # write_dataset takes the same field, from worker processes.
    class Files:
        def __len__(self):
            return len(photos)

        def __getitem__(self, i):
            with open(photos[i], "rb") as f:
                return {"image": f.read(), "label": i % 2}
    wd = os.path.join(tmp, "wd")
    kiln.write_dataset(Files(), wd, fields, workers=2, progress=False)
    c = kiln.Cache(wd)
    for i, p in enumerate(photos):
        with open(p, "rb") as f:
            assert c.read(i, decode=False)["image"].tobytes() == f.read(), p
    gray = kiln.Writer(os.path.join(tmp, "g"), {"image": kiln.Field("uint8", (1, None, None), "jpeg")})
    expect_raises(ValueError, lambda: gray.append({"image": first}), "colour JPEG")
    gray._native.abandon()
    fixed = kiln.Writer(os.path.join(tmp, "f"), {"image": kiln.Field("uint8", (3, 10, 10), "jpeg")})
    expect_raises(ValueError, lambda: fixed.append({"image": first}), "for a field of 3x10x10")
    fixed._native.abandon()


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
