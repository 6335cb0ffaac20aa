"""Caches that grow: kiln.Writer(mode="append") and write_dataset(append=True);
write_dataset from iterables and from Hugging Face datasets. Run as
test_append.py SYNTH DUMP_RECORDS DUMP_BATCHES CHECK (module_common.py); one
CTest test per check."""
import glob
import io
import json
import os
import signal
import subprocess
import sys
import time

from module_common import SKIP, expect_raises, run

import kiln
import numpy as np
import torch

from writer_samples import FIELDS, Samples, sample  # noqa: E402

CLASSES = ["c%d" % k for k in range(5)]


def shards(path):
    return {os.path.basename(p): open(p, "rb").read()
            for p in sorted(glob.glob(os.path.join(path, "shard-*.mdb")))}


def records(path):
    """Every record of the cache at `path`, field by field, as bytes."""
    c = kiln.Cache(path)
    return [{k: (v.dtype.str, v.shape, v.tobytes()) for k, v in c.read(i, verify=True).items()}
            for i in range(len(c))]


def write(path, indices, mode="w", **kw):
    with kiln.Writer(path, FIELDS, classes=kw.pop("classes", CLASSES), shard_size=20000,
                     mode=mode, **kw) as w:
        for i in indices:
            w.append(sample(i))
    return w.manifest


def check_writer_append(tmp):
    """Writer(mode="append") adds records after the old ones in new shards,
    leaving the old shards' bytes alone; a Cache opened before sees the old
    records during and after the append; the manifest records each append;
    two appends give the records of one write."""
    path = os.path.join(tmp, "c")
    write(path, range(40))
    old = shards(path)
    early = kiln.Cache(path)
    w = kiln.Writer(path, FIELDS, shard_size=20000, mode="append", dataset="week 2")
    assert w.append_base == 40 and w.next_index == 40
    for i in range(40, 65):
        assert w.append(sample(i)) == i
    during = kiln.Cache(path)
    assert len(during) == 40, len(during)
    m = w.close()
    assert m["count"] == 65 and m["classes"] == CLASSES, m
    assert [(a["count_before"], a["count_after"], a["from"]) for a in m["appends"]] == \
        [(40, 65, "week 2")], m["appends"]
    write(path, range(65, 71), mode="append")
    now = shards(path)
    for name, data in old.items():
        assert now[name] == data, "append rewrote " + name
    assert len(early) == 40 and early.read(39, verify=True)["label"] == 39 % 5
    whole = os.path.join(tmp, "whole")
    write(whole, range(71))
    assert records(path) == records(whole), "two appends differ from one write"
    report = kiln.verify(path)
    assert report["problems"] == [] and report["records_checked"] == 71, report
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert [a["count_after"] for a in manifest["appends"]] == [65, 71]


def check_append_refusals(tmp):
    """An append that does not fit the cache is refused with the reason,
    leaving the cache as it was."""
    path = os.path.join(tmp, "c")
    write(path, range(10))
    before = open(os.path.join(path, "manifest.json")).read()
    other = dict(FIELDS, score=kiln.Field("float32", (2,)))
    expect_raises(ValueError, lambda: kiln.Writer(path, other, mode="append"),
                  "cannot append", "score float32")
    expect_raises(ValueError, lambda: write(path, [10], mode="append", classes=["x"]),
                  "cannot append", "classes")
    expect_raises(ValueError, lambda: kiln.Writer(os.path.join(tmp, "none"), FIELDS,
                                                  mode="append"))
    expect_raises(ValueError, lambda: kiln.Writer(path, FIELDS, mode="a"), "mode")
    assert open(os.path.join(path, "manifest.json")).read() == before
    assert len(kiln.Cache(path)) == 10


def check_write_dataset_append(tmp):
    """write_dataset(append=True), with workers and a skipped sample, gives
    the records of one write_dataset of both batches; the append's skips are
    logged apart from the first write's."""
    path = os.path.join(tmp, "c")
    args = dict(classes=CLASSES, shard_size=20000, progress=False)
    kiln.write_dataset(Samples(30, bad=4), path, FIELDS, workers=2, **args)
    m = kiln.write_dataset(Samples(25, bad=3, first=30), path, FIELDS, workers=2, append=True, **args)
    assert m["count"] == 29 + 24 and m["appends"][0]["count_before"] == 29, m
    assert m["appends"][0]["from"] == "Samples", m["appends"]
    log = open(os.path.join(path, "skipped-append-29.tsv")).read().splitlines()
    assert len(log) == 2 and log[1].startswith("3\t"), log
    assert open(os.path.join(path, "skipped.tsv")).read().splitlines()[1].startswith("4\t")

    class Both(Samples):
        def __getitem__(self, i):
            if i in (4, 33):
                raise OSError("bad")
            return sample(i)
    whole = os.path.join(tmp, "whole")
    kiln.write_dataset(Both(55), whole, FIELDS, **args)
    assert records(path) == records(whole), "write + append differs from one write"


APPEND_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import writer_samples as t
import kiln
kiln.write_dataset(t.Samples(90, bad=7, delay=0.05, slow_after=40, first=50), sys.argv[2], t.FIELDS,
                   workers=2, shard_size=20000, progress=False, append=True)
"""


def check_append_resume_after_kill(tmp):
    """An append killed (SIGKILL) mid-way leaves the old records readable and
    verified; run again it resumes to the shards of an uninterrupted append."""
    args = dict(classes=CLASSES, shard_size=20000, progress=False)
    straight, path = os.path.join(tmp, "straight"), os.path.join(tmp, "resumed")
    for p in (straight, path):
        kiln.write_dataset(Samples(50), p, FIELDS, **args)
    kiln.write_dataset(Samples(90, bad=7, first=50), straight, FIELDS, workers=2, append=True, **args)
    here = os.path.dirname(os.path.abspath(__file__))
    first = len(shards(path))
    p = subprocess.Popen([sys.executable, "-c", APPEND_CHILD, here, path],
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while len(shards(path)) < first + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    c = kiln.Cache(path)
    assert len(c) == 50, "the killed append changed the manifest: %d records" % len(c)
    report = kiln.verify(path)
    assert report["problems"] == [] and report["records_checked"] == 50, report
    m = kiln.write_dataset(Samples(90, bad=7, first=50), path, FIELDS, workers=2, append=True, **args)
    assert m["count"] == 50 + 89, m["count"]
    assert shards(path) == shards(straight), "resumed append differs from a straight one"
    assert open(os.path.join(path, "skipped-append-50.tsv")).read() == \
        open(os.path.join(straight, "skipped-append-50.tsv")).read()


class Stream(torch.utils.data.IterableDataset):
    """sample(0..n-1) as a torch IterableDataset; raises after `fail_at` items."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at = n, fail_at

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise KeyboardInterrupt("the stream broke")
            yield sample(i)


def check_iterables(tmp):
    """An iterator and a torch IterableDataset are written in the order they
    yield: the shards of the map-style write of the same samples; one that
    breaks off resumes after its committed records (the items before are
    consumed and dropped) to the same shards."""
    args = dict(classes=CLASSES, shard_size=3000, progress=False)  # a shard per ~7 samples
    ref = os.path.join(tmp, "ref")
    kiln.write_dataset(Samples(45), ref, FIELDS, **args)
    gen = os.path.join(tmp, "gen")
    m = kiln.write_dataset((sample(i) for i in range(45)), gen, FIELDS, workers=2, **args)
    assert m["count"] == 45 and m["preprocessing"]["dataset"] == "generator", m
    assert shards(gen) == shards(ref)
    broken = os.path.join(tmp, "broken")
    expect_raises(KeyboardInterrupt, lambda: kiln.write_dataset(
        Stream(45, fail_at=31), broken, FIELDS, **args), "broke")
    assert not os.path.exists(os.path.join(broken, "manifest.json"))
    kiln.write_dataset(Stream(45), broken, FIELDS, **args)
    assert shards(broken) == shards(ref), "a resumed stream differs"
    short = os.path.join(tmp, "short")
    expect_raises(KeyboardInterrupt, lambda: kiln.write_dataset(
        Stream(45, fail_at=31), short, FIELDS, **args))
    expect_raises(ValueError, lambda: kiln.write_dataset(
        iter([sample(0)]), short, FIELDS, **args), "yielded only 1")
    # An iterable appended to a cache.
    kiln.write_dataset((sample(i) for i in range(45, 60)), gen, FIELDS, append=True, **args)
    assert len(kiln.Cache(gen)) == 60
    assert np.array_equal(kiln.Cache(gen)[59]["image"], sample(59)["image"])


def check_hugging_face(tmp):
    """A Hugging Face datasets.Dataset (made here, in memory) is written in
    its row order: PIL images decoded in the workers into uint8 (C, H, W),
    ClassLabel names as the classes; a JPEG field stores each row's JPEG
    bytes as they are and a PNG row's pixels encoded."""
    try:
        import datasets
    except ImportError as e:
        print("SKIP: %s lacks datasets: %s" % (sys.executable, e))
        sys.exit(SKIP)
    from PIL import Image
    rng = np.random.default_rng(5)
    pils, jpegs = [], []
    for i in range(24):
        a = rng.integers(0, 256, (9 + i % 5, 12 + i % 3, 3), dtype=np.uint8)
        pils.append(Image.fromarray(a))
        buf = io.BytesIO()
        pils[-1].save(buf, format="JPEG" if i % 6 else "PNG", quality=90)
        jpegs.append(buf.getvalue())
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["cat", "dog", "eel"])})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in jpegs], "label": [i % 3 for i in range(24)]},
        features=features)
    fields = {"image": kiln.Field("uint8", (3, None, None)), "label": kiln.Field("int64", ())}
    path = os.path.join(tmp, "hf")
    m = kiln.write_dataset(ds, path, fields, workers=2, progress=False)
    assert m["classes"] == ["cat", "dog", "eel"] and m["count"] == 24, m
    c = kiln.Cache(path)
    for i in range(24):
        want = np.asarray(Image.open(io.BytesIO(jpegs[i])).convert("RGB")).transpose(2, 0, 1)
        got = c.read(i, verify=True)
        assert np.array_equal(got["image"], want), i
        assert int(got["label"]) == i % 3
    # JPEG field: JPEG rows stored as their own bytes, PNG rows encoded.
    jfields = dict(fields, image=kiln.Field("uint8", (3, None, None), "jpeg"))
    jpath = os.path.join(tmp, "hf-jpeg")
    kiln.write_dataset(ds, jpath, jfields, workers=2, progress=False)
    jc = kiln.Cache(jpath)
    for i in range(24):
        stored = jc.read(i, decode=False)["image"].tobytes()
        if i % 6:
            assert stored == jpegs[i], "row %d's JPEG was not stored as it is" % i
        else:
            assert stored[:3] == b"\xff\xd8\xff" and stored != jpegs[i]
            assert jc.read(i)["image"].shape == (3,) + pils[i].size[::-1]
    # An append from a second Hugging Face dataset.
    kiln.write_dataset(ds.select(range(5)), path, fields, append=True, progress=False)
    assert len(kiln.Cache(path)) == 29
    assert np.array_equal(kiln.Cache(path)[27]["image"], c[3]["image"])


def check_merge_caches(tmp):
    """kiln.merge joins two Writer caches in order, classes matched by name
    (the second's labels mapped, its shards linked); caches with other
    fields are refused."""
    a, b, out = (os.path.join(tmp, n) for n in ("a", "b", "out"))
    write(a, range(30), classes=["c0", "c1", "c2", "c3", "c4"])
    write(b, range(30, 50), classes=["c3", "c4", "c0", "new1", "new2"])
    r = kiln.merge(out, [a, b])
    assert r["records"] == 50 and r["rewritten_records"] == 0, r
    assert r["relabelled_records"] == 20, r
    raw = json.load(open(os.path.join(out, "manifest.json")))
    of_b = sorted(shards(b))
    for entry, name in zip(raw["shards"][-len(of_b):], of_b):
        assert os.path.samefile(os.path.join(out, entry["file"]), os.path.join(b, name))
        assert entry["label_map"] == [3, 4, 0, 5, 6], entry
    m = kiln.Cache(out).manifest
    assert m["classes"] == ["c0", "c1", "c2", "c3", "c4", "new1", "new2"], m["classes"]
    assert m["appends"][0]["count_before"] == 30 and m["appends"][0]["count_after"] == 50
    got, ca, cb = records(out), records(a), records(b)
    assert got[:30] == ca
    for i in range(20):  # the same fields; the label by name
        old, new = cb[i], got[30 + i]
        assert {k: v for k, v in old.items() if k != "label"} == \
            {k: v for k, v in new.items() if k != "label"}
        name_b = ["c3", "c4", "c0", "new1", "new2"][int(np.frombuffer(old["label"][2], "<i8")[0])]
        assert m["classes"][int(np.frombuffer(new["label"][2], "<i8")[0])] == name_b
    assert kiln.verify(out)["clean"]
    # An append onto it keeps the label maps of the linked shards.
    write(out, range(65, 70), mode="append", classes=m["classes"])
    assert records(out)[:50] == got[:50]
    assert kiln.verify(out)["clean"]
    # The same classes: no record is written again, the second cache's
    # shards are linked under their own keys (a format 3 manifest); the
    # merged cache reads, verifies and grows like any other.
    c, same = os.path.join(tmp, "c"), os.path.join(tmp, "same")
    write(c, range(50, 62), classes=["c0", "c1", "c2", "c3", "c4"])
    r = kiln.merge(same, [a, c])
    assert r["records"] == 42 and r["rewritten_records"] == 0, r
    raw = json.load(open(os.path.join(same, "manifest.json")))
    assert raw["format_version"] == 3 and raw["record_format"] == 2, raw["format_version"]
    of_c = sorted(shards(c))
    linked = raw["shards"][-len(of_c):]
    assert linked[0]["key_first"] == 0 and linked[0]["first"] == 30, raw["shards"]
    for entry, name in zip(linked, of_c):  # hard links: no tensor data copied
        assert os.path.samefile(os.path.join(same, entry["file"]), os.path.join(c, name))
    assert records(same) == records(a) + records(c)
    assert kiln.Cache(same).format_version == 2
    assert kiln.verify(same)["clean"]
    write(same, range(62, 65), mode="append")
    got = records(same)
    whole = os.path.join(tmp, "whole3")
    write(whole, list(range(30)) + list(range(50, 65)))
    assert got == records(whole), "merge + append differs from one write"
    assert kiln.verify(same)["clean"]
    other = os.path.join(tmp, "other")
    with kiln.Writer(other, {"image": kiln.Field("uint8", (3, None, None))}) as w:
        w.append({"image": np.zeros((3, 4, 4), np.uint8)})
    expect_raises(ValueError, lambda: kiln.merge(os.path.join(tmp, "out2"), [a, other]),
                  other, "fields")


def duplicate_lines(path):
    """duplicates.tsv's lines after the header, as (group, record, label) tuples."""
    lines = open(os.path.join(path, "duplicates.tsv")).read().splitlines()
    assert lines[0] == "group\tsplit\trecord\tlabel\tclass\tpath", lines[0]
    return [tuple(int(line.split("\t")[k]) for k in (0, 2, 3)) for line in lines[1:]]


def check_writer_duplicates(tmp):
    """A finished Writer cache has duplicates.tsv, as a kiln build cache
    does; an append's report covers its records against the old ones (the
    old shards' fingerprints kept from the first report); a part has none."""
    path = os.path.join(tmp, "c")
    with kiln.Writer(path, FIELDS, classes=CLASSES, shard_size=20000) as w:
        for i in range(20):
            w.append(sample(i))
        w.append(sample(7))  # record 20 = record 7
        assert w.duplicates is None
    assert w.duplicates == {"groups": 1, "repeats": 1, "label_conflicts": 0}, w.duplicates
    assert duplicate_lines(path) == [(0, 7, 2), (0, 20, 2)]
    prints = sorted(os.listdir(os.path.join(path, ".fingerprints")))
    assert len(prints) == len(shards(path)), prints
    with kiln.Writer(path, FIELDS, shard_size=20000, mode="append") as w:
        w.append(sample(30))
        other = sample(3)
        other["label"] = 4  # the pixels of record 3 under another class
        w.append(other)
        w.append(sample(30))
    assert w.duplicates == {"groups": 3, "repeats": 3, "label_conflicts": 1}, w.duplicates
    assert duplicate_lines(path) == [(0, 3, 3), (0, 22, 4), (1, 7, 2), (1, 20, 2),
                                     (2, 21, 0), (2, 23, 0)], duplicate_lines(path)
    # The old shards' prints were kept, not made again; each new shard has its own.
    now = sorted(os.listdir(os.path.join(path, ".fingerprints")))
    assert set(prints) <= set(now) and len(now) == len(shards(path)), (prints, now)
    assert kiln.verify(path)["clean"]
    part = os.path.join(tmp, "part")
    with kiln.Writer(part, FIELDS, classes=CLASSES, part=(0, 2, 0)) as w:
        w.append(sample(1))
        w.append(sample(1))
    assert w.duplicates is None and not os.path.exists(os.path.join(part, "duplicates.tsv"))


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
