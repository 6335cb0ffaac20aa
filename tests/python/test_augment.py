"""kiln.Loader's load-time geometry: RandomResizedCrop + flip for training and
Resize + CenterCrop for evaluation, computed by the C++ workers, against PIL
and torchvision; the boxes it reports; resolution schedules.
Run as test_augment.py SYNTH DUMP_RECORDS DUMP_BATCHES CHECK
(module_common.py); needs KILN_BIN and KILN_SAMPLE_PHOTOS (kiln build)."""
import math
import os
import subprocess
import sys

from module_common import SKIP, expect_raises, run, synth

import kiln
import numpy as np
import torch
from PIL import Image
from test_build_whole import build, pil_bilinear, png_folder, sources

KILN = os.environ.get("KILN_BIN")
PHOTOS = os.environ.get("KILN_SAMPLE_PHOTOS")


def need_build():
    if not (KILN and PHOTOS):
        print("SKIP: KILN_BIN or KILN_SAMPLE_PHOTOS unset")
        sys.exit(SKIP)


def whole_cache(tmp, *args):
    src = png_folder(tmp)
    return src, build(src, os.path.join(tmp, "whole"), *args)


def pil_of(chw):
    return Image.fromarray(np.ascontiguousarray(chw.transpose(1, 2, 0)))


def pil_rrc(chw, box, size):
    """PIL's crop(box).resize(size, BILINEAR) (Pillow 13's, pil_bilinear),
    flipped when box[4]: the reference the loader's output must equal."""
    t, l, h, w, flip = [int(v) for v in box]
    img = pil_bilinear(pil_of(chw).crop((l, t, l + w, t + h)), (size, size))
    a = np.asarray(img)
    if flip:
        a = a[:, ::-1]
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def epoch_samples(loader, epoch_order):
    """(index, x, box) of every sample of one epoch, in order."""
    out, k = [], 0
    for x, _ in loader:
        boxes = loader.boxes()
        for j in range(x.shape[0]):
            out.append((epoch_order[k], x[j].clone(), boxes[j].clone()))
            k += 1
    return out


def check_rrc_matches_pil(tmp):
    """Given each sample's box from loader.boxes(), the uint8 output is PIL's
    crop(box).resize((32, 32), BILINEAR) (+ flip) byte for byte, over several
    epochs of whole images; boxes lie inside their images, about half are
    flipped, and they change from epoch to epoch."""
    need_build()
    _, cache = whole_cache(tmp, "--max-side", "96")
    loader = kiln.Loader(cache, batch_size=3, crop=kiln.RandomResizedCrop(32), flip=True,
                         workers=2, seed=5)
    flips, per_epoch = 0, []
    for epoch in range(6):
        samples = epoch_samples(loader, loader.epoch_order(epoch))
        assert len(samples) == len(cache)
        for idx, x, box in samples:
            img = cache[idx]["image"]
            t, l, h, w, f = [int(v) for v in box]
            assert 0 <= t and 0 <= l and t + h <= img.shape[1] and l + w <= img.shape[2], box
            assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 32, 32)
            assert np.array_equal(x.numpy(), pil_rrc(img, box, 32)), (epoch, idx, box)
            flips += f
        per_epoch.append(sorted((i, tuple(b.tolist())) for i, _, b in samples))
    assert 0 < flips < 6 * len(cache), flips
    assert per_epoch[0] != per_epoch[1]


def check_rrc_normalized_float(tmp):
    """dtype=torch.float16 / float32 without a device: the workers normalize
    with the manifest's mean and std in the same pass: equal to torchvision's
    ToTensor + Normalize of PIL's crop-resize within 0.5/255 mean absolute
    error (in pixel units), float32 exactly as those float32 operations."""
    need_build()
    _, cache = whole_cache(tmp, "--max-side", "96")
    mean, std = cache.normalization
    for dtype in (torch.float32, torch.float16):
        loader = kiln.Loader(cache, batch_size=4, crop=kiln.RandomResizedCrop(40), flip=True,
                             dtype=dtype, seed=3)
        for idx, x, box in epoch_samples(loader, loader.epoch_order(0)):
            assert x.dtype == dtype, x.dtype
            ref = torch.from_numpy(pil_rrc(cache[idx]["image"], box, 40)).float().div(255)
            ref = (ref - torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)) / \
                torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
            err = (x.float() - ref).abs() * torch.tensor(std).view(3, 1, 1) * 255
            assert err.mean().item() < 0.5, err.mean().item()
            if dtype == torch.float32:
                assert torch.equal(x, ref), idx


def draw_torchvision(h, w, n, scale, ratio):
    from torchvision.transforms import RandomResizedCrop
    img = torch.empty(1, h, w)
    out = np.empty((n, 4), dtype=np.int64)
    for k in range(n):
        out[k] = RandomResizedCrop.get_params(img, list(scale), list(ratio))
    return out


def box_stats(boxes, h, w, ratio):
    """Fallback rate (from the box: not a draw torchvision could keep on a
    first try is impossible to tell apart, so count boxes equal to the central
    fallback's), quantiles of area fraction and log aspect ratio."""
    hh, ww = boxes[:, 2].astype(float), boxes[:, 3].astype(float)
    area = hh * ww / (h * w)
    log_aspect = np.log(ww / hh)
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    return np.quantile(area, q), np.quantile(log_aspect, q)


def check_rrc_box_distribution(tmp):
    """kiln's RandomResizedCrop boxes (the loader's draw, exposed as
    kiln._kiln.random_resized_crop_boxes) against torchvision's get_params
    over 100,000 draws on several image sizes and ranges: the rate of the
    central fallback and the quantiles of area fraction and log aspect ratio
    agree within sampling error."""
    from torchvision.transforms import RandomResizedCrop  # noqa: F401
    torch.manual_seed(0)
    cases = [(96, 128, (0.08, 1.0), (3 / 4, 4 / 3), 40000),
             (224, 224, (0.35, 1.0), (3 / 4, 4 / 3), 30000),
             (300, 40, (0.08, 1.0), (3 / 4, 4 / 3), 30000)]
    for h, w, scale, ratio, n in cases:
        ours = kiln._kiln.random_resized_crop_boxes(h, w, n, 7, scale[0], scale[1], ratio[0],
                                                    ratio[1])
        theirs = draw_torchvision(h, w, n, scale, ratio)
        assert ours.shape == (n, 5)
        # The fallback box is deterministic: compare how often each side
        # returns exactly it (a drawn box may equal it too, equally often).
        fb = ours[ours[:, 4] == 1][:1, :4]
        if len(fb):
            rate_ours = np.mean(np.all(ours[:, :4] == fb[0], axis=1))
            rate_theirs = np.mean(np.all(theirs == fb[0], axis=1))
            tol = 5 * math.sqrt(max(rate_theirs, 1e-3) * (1 - rate_theirs) / n) + 1e-3
            assert abs(rate_ours - rate_theirs) < tol, (h, w, rate_ours, rate_theirs)
        a1, r1 = box_stats(ours[:, :4], h, w, ratio)
        a2, r2 = box_stats(theirs, h, w, ratio)
        assert np.all(np.abs(a1 - a2) < 0.015), (h, w, a1, a2)
        assert np.all(np.abs(r1 - r2) < 0.03), (h, w, r1, r2)
        # Positions uniform over what fits: the mean offset in the free room.
        for boxes in (ours, theirs):
            free = (h - boxes[:, 2]).astype(float)
            m = free > 0
            frac = boxes[m, 0] / free[m]
            assert abs(frac.mean() - 0.5) < 0.02, (h, w, frac.mean())


def check_same_boxes_any_workers_and_ranks(tmp):
    """The box (and flip) of sample i in epoch e depends on (seed, e, i) only:
    1 and 3 workers give the same, and ranks 0 and 1 of 2 together give the
    one-rank epoch's boxes; outputs are equal too."""
    need_build()
    _, cache = whole_cache(tmp, "--max-side", "96")

    def mapping(**kv):
        loader = kiln.Loader(cache, batch_size=2, crop=kiln.RandomResizedCrop(24), flip=True,
                             seed=11, **kv)
        loader.set_epoch(2)
        return {i: (tuple(b.tolist()), x.numpy().tobytes())
                for i, x, b in epoch_samples(loader, loader.epoch_order(2))}

    one = mapping(workers=1)
    assert mapping(workers=3) == one
    ranks = {}
    for r in range(2):
        ranks.update(mapping(workers=2, rank=r, world_size=2))
    assert ranks == one


def torchvision_eval(path, resize, crop):
    from torchvision import transforms
    t = transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(crop),
                            transforms.PILToTensor()])
    return t(Image.open(path).convert("RGB")).numpy()


def check_resize_center_crop_equals_torchvision(tmp):
    """On a --shorter-side 80 cache, ResizeCenterCrop(80, 64) equals
    torchvision's Resize(80) + CenterCrop(64) of the source file byte for byte
    (and cuts the stored pixels: the box is the window); ResizeCenterCrop(70,
    64) equals PIL's resize of the stored image then CenterCrop; a crop larger
    than the image pads with zeros as torchvision does."""
    need_build()
    src, cache = whole_cache(tmp, "--shorter-side", "80")
    files = sources(src)
    loader = kiln.Loader(cache, batch_size=3, crop=kiln.ResizeCenterCrop(80, 64), shuffle=False)
    k = 0
    for x, _ in loader:
        boxes = loader.boxes()
        for j in range(x.shape[0]):
            assert np.array_equal(x[j].numpy(), torchvision_eval(files[k], 80, 64)), files[k]
            img = cache[k]["image"]
            t, l, h, w, f = [int(v) for v in boxes[j]]
            assert (h, w, f) == (64, 64, 0) and np.array_equal(
                x[j].numpy(), img[:, t:t + 64, l:l + 64])
            k += 1
    assert k == len(cache)
    from torchvision import transforms
    for resize, crop in ((70, 64), (40, 64)):
        loader = kiln.Loader(cache, batch_size=7, crop=kiln.ResizeCenterCrop(resize, crop),
                             shuffle=False)
        x, _ = next(iter(loader))
        t = transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(crop),
                                transforms.PILToTensor()])
        for i in range(len(cache)):
            assert np.array_equal(x[i].numpy(), t(pil_of(cache[i]["image"])).numpy()), (resize, i)


def check_resolution_change(tmp):
    """set_resolution between epochs: the next epoch's batches have the new
    size (up to max_resolution, refused above it), still equal to PIL's
    crop-resize of their boxes."""
    need_build()
    _, cache = whole_cache(tmp, "--max-side", "96")
    loader = kiln.Loader(cache, batch_size=4, crop=kiln.RandomResizedCrop(24), flip=True,
                         max_resolution=40)
    for epoch, size in ((0, 24), (1, 32), (2, 40), (3, 24)):
        if epoch:
            loader.set_resolution(size)
        assert loader.sample_shape == (3, size, size)
        samples = epoch_samples(loader, loader.epoch_order(epoch))
        for idx, x, box in samples:
            assert tuple(x.shape) == (3, size, size)
            assert np.array_equal(x.numpy(), pil_rrc(cache[idx]["image"], box, size))
    expect_raises(ValueError, lambda: loader.set_resolution(48), "48", "max_crop")
    assert loader.state_dict()["crop"] == 24


def ffcv_resolution(epoch, min_res, max_res, end_ramp, start_ramp, step):
    """FFCV's get_resolution (its ImageNet example's progressive resizing),
    with the step as a parameter: the reference kiln's schedule follows."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / step)) * step


def check_res_schedule(tmp):
    """kiln.resolution_at equals FFCV's get_resolution over random schedules
    whose bounds are multiples of the step; kiln train --res-schedule trains
    each epoch at its size (batches of that shape, the ring sized once),
    evaluates at --crop, and a resume with another schedule is refused; a
    model that cannot take every size (mlp) is refused before training."""
    rng = np.random.default_rng(3)
    compared = 0
    for _ in range(300):
        step = int(rng.choice([8, 16, 32]))
        lo = step * int(rng.integers(1, 8))
        hi = lo + step * int(rng.integers(0, 6))
        start = int(rng.integers(0, 5))
        end = start + int(rng.integers(0, 9))
        spec = "%d:%d:%d:%d:%d" % (lo, hi, start, end, step)
        for epoch in range(end + 3):
            assert kiln.resolution_at(spec, epoch) == \
                ffcv_resolution(epoch, lo, hi, end, start, step), (spec, epoch)
            compared += 1
    assert compared > 1000
    assert kiln.resolution_at("160:192:0:2", 1) == 192  # 176 / 32 = 5.5: half to even
    expect_raises(ValueError, lambda: kiln.resolution_at("192:160:0:2", 0), "MIN <= MAX")

    need_build()
    whole_cache(tmp, "--max-side", "48")
    cache = os.path.join(tmp, "whole")
    base = [KILN, "train", "--data", cache, "--batch-size", "4", "--workers", "1"]
    run = subprocess.run(base + ["--epochs", "4", "--res-schedule", "16:32:0:3:8", "--val", cache,
                                 "--save", os.path.join(tmp, "ck")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = run.stdout
    assert run.returncode == 0, out
    # The sizes of epochs 0..3: 16, 24 (21.3), 24 (26.7), 32.
    assert "epoch 1/4: RandomResizedCrop size 16" in out, out
    assert "epoch 2/4: RandomResizedCrop size 24" in out, out
    assert "epoch 3/4: RandomResizedCrop size" not in out, out  # unchanged: not repeated
    assert "epoch 4/4: RandomResizedCrop size 32" in out, out
    assert "first batch [4, 3, 16, 16]" in out, out
    assert "CenterCrop(32)" in out and "for 3x32x32" in out, out  # evaluation at MAX
    again = subprocess.run(base + ["--epochs", "5", "--res-schedule", "16:32:0:4:8",
                                   "--resume", os.path.join(tmp, "ck")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert again.returncode != 0 and "--res-schedule 16:32:0:3:8" in again.stdout, again.stdout
    more = subprocess.run(base + ["--epochs", "5", "--res-schedule", "16:32:0:3:8",
                                  "--resume", os.path.join(tmp, "ck")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert more.returncode == 0 and "epoch 5/5: RandomResizedCrop size 32" in more.stdout, \
        more.stdout
    mlp = subprocess.run(base + ["--epochs", "3", "--res-schedule", "16:32:0:2:8", "--model",
                                 "mlp"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert mlp.returncode != 0 and "cannot take the 16x16 inputs" in mlp.stdout and \
        "adaptive pooling" in mlp.stdout and "frame #" not in mlp.stdout, mlp.stdout
    bad = subprocess.run(base + ["--epochs", "1", "--res-schedule", "16:32"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert bad.returncode != 0 and "--res-schedule" in bad.stdout and \
        "MIN:MAX:START:END" in bad.stdout, bad.stdout


def check_fixed_records_and_refusals(tmp):
    """RandomResizedCrop on a cache of one fixed size draws its box inside the
    stored record; a plain crop of whole images, RandomResizedCrop of float
    records and bad ranges are refused, saying what to do."""
    path = synth(tmp, "u8", "uint8", shape=(3, 20, 30), n=10)
    loader = kiln.Loader(path, batch_size=5, crop=kiln.RandomResizedCrop(16), shuffle=False)
    cache = kiln.Cache(path)
    for idx, x, box in epoch_samples(loader, loader.epoch_order(0)):
        assert np.array_equal(x.numpy(), pil_rrc(cache[idx]["image"], box, 16))
    f16 = synth(tmp, "f16", "float16", shape=(3, 20, 30), n=4)
    expect_raises(ValueError, lambda: kiln.Loader(f16, 2, crop=kiln.RandomResizedCrop(16)),
                  "uint8", "--max-side N")
    expect_raises(ValueError, lambda: kiln.Loader(
        path, 2, crop=kiln.RandomResizedCrop(16, scale=(0.5, 0.2))), "scale")
    if KILN and PHOTOS:
        _, whole = whole_cache(tmp, "--max-side", "96")
        expect_raises(ValueError, lambda: kiln.Loader(whole, 2, crop=64), "varies in size",
                      "RandomResizedCrop", "ResizeCenterCrop")
        expect_raises(ValueError, lambda: kiln.Loader(whole, 2), "varies in size")
        # The natural two steps: kiln build --max-side without --dtype stores
        # uint8, which RandomResizedCrop reads; a float --dtype is refused,
        # naming the flag to drop.
        src = png_folder(tmp)
        for dtype, ok in ((None, True), ("float16", False)):
            out = os.path.join(tmp, "default-%s" % dtype)
            subprocess.run([KILN, "build", src, out, "--max-side", "64", "--progress", "none"] +
                           (["--dtype", dtype] if dtype else []), check=True,
                           stdout=subprocess.DEVNULL)
            assert kiln.Cache(out).dtype == ("uint8" if ok else dtype)
            make = lambda: kiln.Loader(out, 2, crop=kiln.RandomResizedCrop(32))
            if ok:
                x, _ = next(iter(make()))
                assert tuple(x.shape) == (2, 3, 32, 32), x.shape
            else:
                expect_raises(ValueError, make, "without --dtype float16", "uint8 by default")


def check_train_augment_rrc(tmp):
    """kiln train on a cache of whole images applies RandomResizedCrop + flip
    (and Resize + CenterCrop for --val) by default, saying so at start-up; on
    a --shorter-side cache the evaluation resize is the cache's own; without
    --crop, or with --augment none, it refuses, saying what to do."""
    need_build()
    src, _ = whole_cache(tmp, "--shorter-side", "40")

    def train(*args):
        return subprocess.run([KILN, "train", "--data", os.path.join(tmp, "whole"),
                               "--epochs", "1", "--batch-size", "4"] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    ok = train("--crop", "32", "--val", os.path.join(tmp, "whole"))
    assert ok.returncode == 0, ok.stdout
    assert "augment RandomResizedCrop(32" in ok.stdout and "Resize(40) + CenterCrop(32)" in \
        ok.stdout, ok.stdout
    assert "for 3x32x32" in ok.stdout, ok.stdout
    no_crop = train()
    assert no_crop.returncode != 0 and "--crop N" in no_crop.stdout, no_crop.stdout
    none = train("--crop", "32", "--augment", "none")
    assert none.returncode != 0 and "--augment rrc" in none.stdout, none.stdout


def check_elastic_resume(tmp):
    """A state saved by 2 ranks continues on 1 rank (and one saved by 1 rank
    on 3, with another batch size): the new ranks together see exactly the
    samples the job had not consumed, each once; the next epoch is whole
    again; a state with another seed is still refused."""
    path = synth(tmp, "u8", "uint8")  # 103 unique records
    cache = kiln.Cache(path)
    ident = {cache[i]["image"].tobytes(): i for i in range(len(cache))}

    def take(loader, batches=None):
        got = []
        for k, (x, _) in enumerate(loader):
            got += [ident[x[j].numpy().tobytes()] for j in range(x.shape[0])]
            if batches is not None and k + 1 == batches:
                break
        return got

    def run(world, batch, consume, new_world, new_batch):
        old = [kiln.Loader(path, batch_size=batch, seed=3, rank=r, world_size=world)
               for r in range(world)]
        for l in old:
            l.set_epoch(1)
        seen = sum((take(l, consume) for l in old), [])
        state = old[0].state_dict()
        assert state["consumed"] == consume * batch * world, state
        new = [kiln.Loader(path, batch_size=new_batch, seed=3, rank=r, world_size=new_world)
               for r in range(new_world)]
        rest = []
        for l in new:
            l.load_state_dict(state)
            rest += take(l)
        assert sorted(seen + rest) == list(range(len(cache))), (world, new_world)
        assert all(l.epoch == 2 for l in new)
        whole = sum((take(l) for l in new), [])  # epoch 2: whole again
        assert sorted(set(whole)) == list(range(len(cache)))

    run(2, 4, 5, 1, 6)   # 40 consumed, 63 left for one rank
    run(1, 4, 7, 3, 5)   # 28 consumed, 75 left: 25 per rank
    a = kiln.Loader(path, batch_size=4, seed=3, world_size=2, rank=0)
    take(a, 2)
    other = kiln.Loader(path, batch_size=4, seed=4)
    expect_raises(ValueError, lambda: other.load_state_dict(a.state_dict()), "seed")


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
