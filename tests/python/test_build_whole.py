"""kiln build --max-side / --shorter-side: each image stored whole at its own
size (a format 2 cache of "image" and "label"), sized as torchvision's
Resize(S, max_size=N) sizes it and resampled as PIL's resize(BILINEAR).
Run as test_build_whole.py SYNTH DUMP_RECORDS DUMP_BATCHES CHECK
(module_common.py); needs KILN_BIN and KILN_SAMPLE_PHOTOS (kiln build)."""
import glob
import json
import os
import socket
import subprocess
import sys

from module_common import run

import kiln
import numpy as np
import torch  # noqa: F401  (module_common checked it)
from PIL import Image

KILN = os.environ.get("KILN_BIN")
PHOTOS = os.environ.get("KILN_SAMPLE_PHOTOS")


def png_folder(tmp):
    """sample_data's photos as lossless PNGs in two class folders: the test
    compares resampling, not two JPEG decoders."""
    src = os.path.join(tmp, "src")
    for k, path in enumerate(sorted(glob.glob(os.path.join(PHOTOS, "*.jpg")))):
        d = os.path.join(src, "class_%d" % (k % 2))
        os.makedirs(d, exist_ok=True)
        Image.open(path).convert("RGB").save(os.path.join(d, os.path.basename(path)[:-4] + ".png"))
    return src


def build(src, out, *args, open_cache=True):
    subprocess.run([KILN, "build", src, out, "--dtype", "uint8", "--norm", "imagenet",
                    "--progress", "none"] + list(args), check=True, stdout=subprocess.DEVNULL)
    return kiln.Cache(out) if open_cache else None


def pil_bilinear(im, size):
    """PIL's im.resize(size, BILINEAR) as Pillow 13 computes it, on any
    Pillow: two one-axis resizes (the same in every version) in Pillow 13's
    order - vertical first when the height shrinks by more than twice what
    the width does (Pillow 12 and older always went horizontal first; the
    8-bit intermediate rounds differently). kiln follows Pillow 13. Where
    Pillow itself is 13 or newer, the two-axis resize must equal this."""
    (w, h), (W, H) = im.size, tuple(size)
    if W == w or H == h:
        return im.resize(size, Image.BILINEAR)
    if h - H > 0 and h - H > 2 * (w - W):
        out = im.resize((w, H), Image.BILINEAR).resize((W, H), Image.BILINEAR)
    else:
        out = im.resize((W, h), Image.BILINEAR).resize((W, H), Image.BILINEAR)
    if int(Image.__version__.split(".")[0]) >= 13:
        direct = im.resize(size, Image.BILINEAR)
        assert np.array_equal(np.asarray(direct), np.asarray(out)), \
            "Pillow %s resizes %s -> %s in another order than Pillow 13" % (
                Image.__version__, im.size, size)
    return out


def sources(src):
    """The source files in record order (ImageFolder order)."""
    return sorted(glob.glob(os.path.join(src, "*", "*.png")))


def expected_size(w, h, shorter=0, max_side=0):
    """torchvision's _compute_resized_output_size, with size None allowed."""
    short, long_ = (w, h) if w <= h else (h, w)
    if shorter:
        new_short, new_long = shorter, int(shorter * long_ / short)
    else:
        new_short, new_long = short, long_
    if max_side and new_long > max_side:
        new_short, new_long = max(1, int(max_side * new_short / new_long)), max_side
    return (new_short, new_long) if w <= h else (new_long, new_short)


def check_max_side_matches_pil(tmp):
    """--max-side 96: the longer side 96 (photos are larger), the shorter side
    as torchvision computes it, pixels equal to PIL's resize; the manifest
    records the fields and the largest size; inspect/verify --level deep pass."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src = png_folder(tmp)
    c = build(src, os.path.join(tmp, "ms"), "--max-side", "96")
    assert c.format_version == 2 and list(c.fields) == ["image", "label"], c.fields
    assert c.fields["image"] == kiln.Field("uint8", (3, None, None))
    assert c.preprocessing["whole"] is True and c.preprocessing["max_side"] == 96
    files = sources(src)
    assert len(c) == len(files)
    for i, path in enumerate(files):
        im = Image.open(path).convert("RGB")
        w, h = expected_size(*im.size, max_side=96)
        want = np.asarray(pil_bilinear(im, (w, h))).transpose(2, 0, 1)
        got = c[i]["image"]
        assert got.shape == want.shape, (path, got.shape, want.shape)
        assert np.array_equal(got, want), (path, np.abs(got.astype(int) - want).max())
        assert int(c[i]["label"]) == int(os.path.basename(os.path.dirname(path))[-1])
    assert max(c[i]["image"].shape[1] for i in range(len(c))) == c.max_shapes["image"][1]
    subprocess.run([KILN, "verify", os.path.join(tmp, "ms"), "--level", "deep"], check=True,
                   stdout=subprocess.DEVNULL)


def check_shorter_side_matches_torchvision(tmp):
    """--shorter-side 80 equals torchvision's Resize(80) on the PIL image, byte
    for byte; with --max-side 100 too, Resize(80, max_size=100)."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    from torchvision.transforms import functional as F
    src = png_folder(tmp)
    files = sources(src)
    for args, kw in ((["--shorter-side", "80"], {}),
                     (["--shorter-side", "80", "--max-side", "100"], {"max_size": 100})):
        out = os.path.join(tmp, "ss-" + "-".join(args))
        c = build(src, out, *args)
        for i, path in enumerate(files):
            im = Image.open(path).convert("RGB")
            want = np.asarray(F.resize(im, 80, **kw)).transpose(2, 0, 1)
            got = c[i]["image"]
            assert got.shape == want.shape and np.array_equal(got, want), (args, path, got.shape,
                                                                          want.shape)


def check_threads_give_same_bytes(tmp):
    """A whole-image build gives the same shards for 1 and 2 threads, and a
    second run with the same options finds it up to date."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src = png_folder(tmp)
    shards = []
    for threads in ("1", "2"):
        out = os.path.join(tmp, "t" + threads)
        build(src, out, "--max-side", "64", "--threads", threads)
        shards.append([open(p, "rb").read()
                       for p in sorted(glob.glob(os.path.join(out, "shard-*.mdb")))])
    assert shards[0] == shards[1], "1 and 2 threads wrote different shards"
    again = subprocess.run([KILN, "build", src, os.path.join(tmp, "t2"), "--dtype", "uint8",
                            "--norm", "imagenet", "--progress", "none", "--max-side", "64",
                            "--threads", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, check=True)
    assert "up to date" in again.stdout, again.stdout
    bad = subprocess.run([KILN, "build", src, os.path.join(tmp, "x"), "--max-side", "64",
                          "--crop", "32"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    assert bad.returncode == 2 and "exclude --resize, --crop and --size" in bad.stdout, bad.stdout


def check_csv_labels_and_targets(tmp):
    """kiln build --list CSV with "path,labels,age" writes a format 2 cache of
    image, labels (the indices of each line's names, sorted) and target (its
    float columns); kiln train refuses it, naming what it lacks."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src = png_folder(tmp)
    files = sources(src)
    names = ["sea", "cat", "sky"]
    rows = []
    with open(os.path.join(tmp, "t.csv"), "w") as f:
        f.write("path,labels,age\n")
        for i, path in enumerate(files):
            labels = sorted({names[k] for k in range(3) if (i >> k) & 1})
            rows.append((path, labels, i * 1.5))
            f.write("%s,%s,%r\n" % (os.path.relpath(path, src), ";".join(labels), i * 1.5))
    out = os.path.join(tmp, "csv")
    c = build(src, out, "--list", os.path.join(tmp, "t.csv"), "--resize", "40", "--crop", "32")
    assert list(c.fields) == ["image", "labels", "target"], c.fields
    assert c.fields["labels"] == kiln.Field("int64", (None,))
    assert c.fields["target"] == kiln.Field("float32", (1,))
    assert c.classes == sorted(names) and c.preprocessing["targets"] == ["age"]
    for i, (path, labels, age) in enumerate(sorted(rows)):
        rec = c[i]
        assert rec["labels"].tolist() == [c.classes.index(n) for n in labels], (i, rec["labels"])
        assert rec["target"].tolist() == [age], (i, rec["target"])
        assert rec["image"].shape == (3, 32, 32)
    train = subprocess.run([KILN, "train", "--data", out, "--epochs", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert train.returncode != 0 and "no label field" in train.stdout, train.stdout
    # The labels are sources: verify --level sources sees one line's change.
    check = [KILN, "verify", out, "--level", "sources"]
    subprocess.run(check, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(tmp, "t.csv")) as f:
        lines = f.read().split("\n")
    lines[2] = lines[2].replace(",sea,", ",sky,") if ",sea," in lines[2] else lines[2].replace(
        ",", ",sea;", 1)
    with open(os.path.join(tmp, "t.csv"), "w") as f:
        f.write("\n".join(lines))
    stale = subprocess.run(check, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert stale.returncode == 1 and "labels or targets changed" in stale.stdout, stale.stdout


def write_masks(src, root):
    """A mask per source image, of its size: class indices in bands and a
    rectangle (values 0..4), saved as mode L PNGs at the same relative paths."""
    out = {}
    for path in sources(src):
        w, h = Image.open(path).size
        yy, xx = np.mgrid[0:h, 0:w]
        m = ((xx // 7 + yy // 5) % 4).astype(np.uint8)
        m[h // 4:h // 2, w // 3:w // 2] = 4
        rel = os.path.relpath(path, src)
        dst = os.path.join(root, os.path.splitext(rel)[0] + ".png")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        Image.fromarray(m, mode="L").save(dst)
        out[path] = m
    return out


def check_masks_follow_geometry(tmp):
    """kiln build --masks: each record's "mask" is its PNG resized with
    nearest neighbour on the image's geometry - torchvision's Resize(S,
    NEAREST) + CenterCrop(C) for --resize/--crop, PIL's resize(size, NEAREST)
    to the image's own size for --max-side; a missing or colour mask rejects
    the record, naming the mask; the loader's RandomResizedCrop takes the
    mask along."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    from torchvision import transforms
    src = png_folder(tmp)
    masks = write_masks(src, os.path.join(tmp, "masks"))
    files = sources(src)
    fixed = build(src, os.path.join(tmp, "fixed"), "--resize", "40", "--crop", "32", "--masks",
                  os.path.join(tmp, "masks"))
    assert list(fixed.fields) == ["image", "mask", "label"], fixed.fields
    assert fixed.fields["mask"] == kiln.Field("uint8", (32, 32))
    assert fixed.preprocessing["masks"] == os.path.join(tmp, "masks")
    t = transforms.Compose([transforms.Resize(40, interpolation=transforms.InterpolationMode.NEAREST),
                            transforms.CenterCrop(32)])
    for i, path in enumerate(files):
        want = np.asarray(t(Image.fromarray(masks[path], mode="L")))
        assert np.array_equal(fixed[i]["mask"], want), path
    whole = build(src, os.path.join(tmp, "whole"), "--max-side", "64", "--masks",
                  os.path.join(tmp, "masks"))
    assert whole.fields["mask"] == kiln.Field("uint8", (None, None))
    for i, path in enumerate(files):
        img = whole[i]["image"]
        want = np.asarray(Image.fromarray(masks[path], mode="L").resize(
            (img.shape[2], img.shape[1]), Image.NEAREST))
        assert np.array_equal(whole[i]["mask"], want), path
    # The loader: the mask gets the image's box and flip.
    loader = kiln.Loader(whole, batch_size=4, crop=kiln.RandomResizedCrop(24), flip=True)
    order, k = loader.epoch_order(0), 0
    for b in loader:
        for j, box in enumerate(loader.boxes()):
            t_, l, h, w, f = [int(v) for v in box]
            m = Image.fromarray(whole[order[k]]["mask"]).crop((l, t_, l + w, t_ + h)).resize(
                (24, 24), Image.NEAREST)
            want = np.asarray(m)[:, ::-1] if f else np.asarray(m)
            assert np.array_equal(b["mask"][j].numpy(), want)
            k += 1
    # A missing mask and a colour one: those records are rejected, named.
    os.remove(os.path.join(tmp, "masks", os.path.relpath(files[0], src)))
    Image.new("RGB", Image.open(files[1]).size).save(
        os.path.join(tmp, "masks", os.path.relpath(files[1], src)))
    out = subprocess.run([KILN, "build", src, os.path.join(tmp, "bad"), "--dtype", "uint8",
                          "--norm", "imagenet", "--resize", "40", "--crop", "32", "--masks",
                          os.path.join(tmp, "masks"), "--progress", "none"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode == 0, out.stdout
    with open(os.path.join(tmp, "bad", "rejects.tsv")) as f:
        rejects = f.read()
    assert "is missing" in rejects and "one 8-bit channel" in rejects, rejects
    assert len(kiln.Cache(os.path.join(tmp, "bad"))) == len(files) - 2


def masked_folder(tmp):
    """png_folder with a mask per image (write_masks) in TMP/masks: (source
    folder, mask folder, source files in record order)."""
    src = png_folder(tmp)
    masks = os.path.join(tmp, "masks")
    write_masks(src, masks)
    return src, masks, sources(src)


def cache_records(path):
    """Every record of a cache: {field: (shape, bytes)}."""
    c = kiln.Cache(path)
    return [{k: (v.shape, v.tobytes()) for k, v in c[i].items()} for i in range(len(c))]


def check_parts_merge_and_repair(tmp):
    """A format 2 build (whole images, masks, several labels and a float
    target from a CSV) in 2 parts - part 0 rejecting a broken file, so part 1
    is re-indexed - merges into the one-part build's records, manifest
    fields, sources.tsv and rejects.tsv; a byte flipped in a merged record's
    mask is repaired by kiln build --repair back to the shards' bytes."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src, masks, files = masked_folder(tmp)
    broken = os.path.join(src, "class_0", "0_broken.png")
    with open(broken, "wb") as f:
        f.write(b"not a png")
    with open(os.path.join(tmp, "t.csv"), "w") as f:
        f.write("path,labels,score\n")
        for i, path in enumerate([broken] + files):
            f.write("%s,%s,%r\n" % (os.path.relpath(path, src), ";".join(
                ["a", "b", "c"][k] for k in range(3) if (i >> k) & 1), i * 0.25))
    args = ["--list", os.path.join(tmp, "t.csv"), "--max-side", "48", "--masks", masks]
    one, parts = os.path.join(tmp, "one"), os.path.join(tmp, "parts")
    build(src, one, *args)
    for part in ("0", "1"):
        build(src, parts, *args, "--num-parts", "2", "--part", part, open_cache=False)
    merged = subprocess.run([KILN, "merge", parts], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert merged.returncode == 0 and "rewriting its" in merged.stdout, merged.stdout
    assert cache_records(parts) == cache_records(one)
    assert len(kiln.Cache(one)) == len(files)
    manifests = [json.load(open(os.path.join(d, "manifest.json"))) for d in (one, parts)]
    for key in ("format_version", "fields", "label_field", "preprocessing"):
        assert manifests[0].get(key) == manifests[1].get(key), key
    for name in ("sources.tsv", "rejects.tsv"):
        assert open(os.path.join(parts, name)).read() == open(os.path.join(one, name)).read(), name
    subprocess.run([KILN, "verify", parts, "--level", "deep"], check=True,
                   stdout=subprocess.DEVNULL)
    # Damage record 2's mask in place; --repair makes it again from its files.
    shard_paths = sorted(glob.glob(os.path.join(parts, "shard-*.mdb")))
    before = [open(p, "rb").read() for p in shard_paths]
    mask = kiln.Cache(parts)[2]["mask"].tobytes()
    hits = [(k, b.find(mask)) for k, b in enumerate(before) if b.find(mask) >= 0]
    assert hits, "record 2's mask not found in its shard"
    k, at = hits[0]
    damaged = bytearray(before[k])
    damaged[at + len(mask) // 2] ^= 0x01
    open(shard_paths[k], "wb").write(damaged)
    bad = subprocess.run([KILN, "verify", parts], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    assert bad.returncode == 1 and "record 2" in bad.stdout, bad.stdout
    fixed = subprocess.run([KILN, "build", src, parts, "--dtype", "uint8", "--norm", "imagenet",
                            "--progress", "none", "--repair"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert fixed.returncode == 0 and "repaired 1 record(s)" in fixed.stdout, fixed.stdout
    assert [open(p, "rb").read() for p in shard_paths] == before
    assert cache_records(parts) == cache_records(one)


def check_mask_changes_are_seen(tmp):
    """The masks are sources too: verify --level deep re-makes every field
    (mask included) and passes on a fresh cache; after one mask file is
    rewritten, verify --level sources says the masks changed, --level deep
    names the record and its 'mask', and kiln build no longer finds the
    cache up to date."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src, masks, files = masked_folder(tmp)
    out = os.path.join(tmp, "c")
    args = ["--max-side", "48", "--masks", masks]
    build(src, out, *args)

    def verify(level):
        return subprocess.run([KILN, "verify", out, "--level", level], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    ok = verify("deep")
    assert ok.returncode == 0, ok.stdout
    rel = os.path.relpath(files[3], src)
    m = np.asarray(Image.open(os.path.join(masks, rel)))
    Image.fromarray((m + 1) % 5, mode="L").save(os.path.join(masks, rel))
    stale = verify("sources")
    assert stale.returncode == 1 and "mask files added, removed or changed" in stale.stdout, \
        stale.stdout
    deep = verify("deep")
    assert deep.returncode == 1 and "record 3" in deep.stdout and "different 'mask'" in \
        deep.stdout, deep.stdout
    again = subprocess.run([KILN, "build", src, out, "--dtype", "uint8", "--norm", "imagenet",
                            "--progress", "none"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert "up to date" not in again.stdout and "masks_digest" in again.stdout, again.stdout


def check_unreadable_mask_is_retried(tmp):
    """A mask that cannot be read for a reason of the environment (here a
    UNIX socket where its PNG should be: open() fails with ENXIO, as it would
    for a device gone away) rejects its image as retryable; the same build again is
    up to date and says the reject still fails (the retry check makes the
    whole record, mask included, not only the image); with the mask made
    readable the next build takes the image in. The reject names the mask."""
    if not (KILN and PHOTOS):
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        return
    src, masks, files = masked_folder(tmp)
    out = os.path.join(tmp, "c")
    rel = os.path.relpath(files[2], src)
    mask = os.path.join(masks, rel)
    os.remove(mask)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(mask)

    def build_again():
        return subprocess.run([KILN, "build", src, out, "--dtype", "uint8", "--norm", "imagenet",
                               "--progress", "none", "--max-side", "48", "--masks", masks],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = build_again()
    assert first.returncode == 0, first.stdout
    rejects = open(os.path.join(out, "rejects.tsv")).read()
    assert os.path.basename(files[2]) in rejects and "\tyes" in rejects, rejects
    assert "its mask " + mask in rejects, rejects  # the reason names the mask
    assert len(kiln.Cache(out)) == len(files) - 1
    second = build_again()
    assert second.returncode == 0 and "nothing written" in second.stdout and \
        "still fails" in second.stdout, second.stdout
    sock.close()


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
