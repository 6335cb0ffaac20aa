"""kiln.Loader delivers every field of a format 2 cache: fixed fields
batched, varying ones padded to the batch's longest with NAME_lengths; a
"mask" gets the image's box and flip (nearest neighbour), "boxes" are mapped
into the crop. Run as test_loader_fields.py SYNTH DUMP_RECORDS DUMP_BATCHES
CHECK (module_common.py)."""
import os
import sys

from module_common import expect_raises, run

import kiln
import numpy as np
import torch
from PIL import Image

FIELDS = {"image": kiln.Field("uint8", (3, None, None)),
          "mask": kiln.Field("uint8", (None, None)),
          "boxes": kiln.Field("float32", (None, 4)),
          "labels": kiln.Field("int64", (None,)),
          "target": kiln.Field("float32", (2,)),
          "label": kiln.Field("int64", ())}


def write(tmp, n=12, fixed=False):
    """n records: a random image of its own size, a mask that is 1 inside
    each record's boxes (drawn rectangles), 0..3 boxes, 0..4 labels."""
    rng = np.random.default_rng(4)
    path = os.path.join(tmp, "fields")
    fields = dict(FIELDS)
    if fixed:
        fields["image"] = kiln.Field("uint8", (3, 40, 50))
        fields["mask"] = kiln.Field("uint8", (40, 50))
    records = []
    with kiln.Writer(path, fields, classes=["a", "b", "c"], label_field="label",
                     mean=[0.5] * 3, std=[0.25] * 3) as w:
        for i in range(n):
            h, wd = (40, 50) if fixed else (int(rng.integers(30, 70)), int(rng.integers(30, 70)))
            img = rng.integers(0, 256, (3, h, wd), dtype=np.uint8)
            mask = np.zeros((h, wd), dtype=np.uint8)
            boxes = []
            for _ in range(i % 4):
                x1, y1 = int(rng.integers(0, wd - 8)), int(rng.integers(0, h - 8))
                x2, y2 = x1 + int(rng.integers(4, 9)), y1 + int(rng.integers(4, 9))
                boxes.append([x1, y1, x2, y2])
                mask[y1:y2, x1:x2] = 1
            rec = {"image": img, "mask": mask,
                   "boxes": np.array(boxes, dtype=np.float32).reshape(-1, 4),
                   "labels": np.arange(i % 5, dtype=np.int64),
                   "target": np.array([i, -i], dtype=np.float32), "label": i % 3}
            w.append(rec)
            records.append(rec)
    return path, records


def check_plain_fields_padded(tmp):
    """Without a crop (a cache of one image size): a dict per batch, fixed
    fields as stored, varying ones padded with zeros to the batch's longest
    and their lengths; the image and label as usual."""
    path, records = write(tmp, fixed=True)
    loader = kiln.Loader(path, batch_size=5, shuffle=False)
    assert loader.yields_dict
    k = 0
    for b in loader:
        assert set(b) == {"image", "label", "mask", "boxes", "boxes_lengths", "labels",
                          "labels_lengths", "target"}, set(b)
        n = b["image"].shape[0]
        longest = max(len(records[k + j]["labels"]) for j in range(n))
        assert b["labels"].shape == (n, longest), b["labels"].shape
        for j in range(n):
            r = records[k + j]
            assert np.array_equal(b["image"][j].numpy(), r["image"])
            assert np.array_equal(b["mask"][j].numpy(), r["mask"])
            nl = len(r["labels"])
            assert int(b["labels_lengths"][j]) == nl
            assert b["labels"][j, :nl].tolist() == r["labels"].tolist()
            assert not b["labels"][j, nl:].any()
            nb = len(r["boxes"])
            assert int(b["boxes_lengths"][j]) == nb
            assert np.array_equal(b["boxes"][j, :nb].numpy(), r["boxes"])
            assert b["target"][j].tolist() == r["target"].tolist()
            assert int(b["label"][j]) == r["label"]
        k += n
    assert k == len(records)


def mapped_boxes(boxes, box, size):
    """The loader's documented mapping, written out: xyxy in the stored image
    -> the crop resized to size x size, clipped, empty ones dropped, flipped."""
    t, l, h, w, flip = [int(v) for v in box]
    out = []
    for x1, y1, x2, y2 in boxes:
        sx, sy = size / w, size / h
        nx1, nx2 = [min(max((v - l) * sx, 0), size) for v in (x1, x2)]
        ny1, ny2 = [min(max((v - t) * sy, 0), size) for v in (y1, y2)]
        if nx2 > nx1 and ny2 > ny1:
            if flip:
                nx1, nx2 = size - nx2, size - nx1
            out.append([nx1, ny1, nx2, ny2])
    return np.array(out, dtype=np.float32).reshape(-1, 4)


def check_mask_and_boxes_follow_the_crop(tmp):
    """RandomResizedCrop + flip: the mask is PIL's crop(box).resize(NEAREST)
    of the stored mask (+ flip) - a drawn rectangle stays on its box: inside
    each mapped box (less a pixel) the mask is 1, and outside every mapped
    box (plus a pixel) it is 0; boxes are mapped into the crop, clipped, the
    empty ones dropped (lengths say how many are left)."""
    path, records = write(tmp, n=24)
    size = 32
    loader = kiln.Loader(path, batch_size=6, crop=kiln.RandomResizedCrop(size, scale=(0.3, 1.0)),
                         flip=True, seed=9)
    for epoch in range(3):
        order = loader.epoch_order(epoch)
        k = 0
        for b in loader:
            boxes_of = loader.boxes()
            for j in range(b["image"].shape[0]):
                r = records[order[k]]
                box = boxes_of[j]
                t, l, h, w, flip = [int(v) for v in box]
                m = Image.fromarray(r["mask"]).crop((l, t, l + w, t + h)).resize(
                    (size, size), Image.NEAREST)
                want = np.asarray(m)[:, ::-1] if flip else np.asarray(m)
                got = b["mask"][j].numpy()
                assert np.array_equal(got, want), (epoch, order[k], box)
                exp = mapped_boxes(r["boxes"], box, size)
                n = int(b["boxes_lengths"][j])
                assert n == len(exp), (n, exp)
                assert np.allclose(b["boxes"][j, :n].numpy(), exp, atol=1e-4)
                inside = np.zeros_like(got, dtype=bool)
                for x1, y1, x2, y2 in exp:
                    sub = got[int(np.ceil(y1)) + 1:int(y2) - 1, int(np.ceil(x1)) + 1:int(x2) - 1]
                    assert sub.size == 0 or sub.all(), (x1, y1, x2, y2)
                    inside[max(int(y1) - 1, 0):int(np.ceil(y2)) + 1,
                           max(int(x1) - 1, 0):int(np.ceil(x2)) + 1] = True
                assert not got[~inside].any(), (epoch, order[k])
                k += 1


def check_resize_center_crop_mask(tmp):
    """Resize + CenterCrop with padding: the mask is resized with nearest
    neighbour on the image's geometry and padded with zeros where the image
    is; a v1-style cache of image + label still yields (x, y)."""
    path, records = write(tmp, n=6)
    loader = kiln.Loader(path, batch_size=6, shuffle=False, crop=kiln.ResizeCenterCrop(20, 28))
    b = next(iter(loader))
    from torchvision import transforms
    t = transforms.Compose([transforms.Resize(20, interpolation=transforms.InterpolationMode.NEAREST),
                            transforms.CenterCrop(28), transforms.PILToTensor()])
    for j, r in enumerate(records):
        want = t(Image.fromarray(r["mask"]))[0].numpy()
        assert np.array_equal(b["mask"][j].numpy(), want), j


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
