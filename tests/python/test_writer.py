"""kiln.Writer: format 2 caches written from Python, read back by kiln.Cache,
kiln.Loader and kiln verify. Run as test_writer.py SYNTH DUMP_RECORDS
DUMP_BATCHES CHECK (module_common.py); one CTest test per check."""
import glob
import json
import os
import signal
import subprocess
import sys

from module_common import expect_raises, run

import kiln
import numpy as np
import torch

from writer_samples import FIELDS, Samples, sample  # noqa: E402


def write(path, n, **kw):
    with kiln.Writer(path, FIELDS, classes=["c%d" % k for k in range(5)],
                     shard_size=kw.pop("shard_size", 20000), **kw) as w:
        for i in range(n):
            assert w.append(sample(i)) == i
    return w.manifest


def shards(path):
    return {os.path.basename(p): open(p, "rb").read()
            for p in sorted(glob.glob(os.path.join(path, "shard-*.mdb")))}


def check_round_trip(tmp):
    """Every field of every record comes back as written, with its dtype and
    shape; the manifest declares the fields with their largest sizes; kiln
    verify finds the cache clean."""
    path = os.path.join(tmp, "c")
    n = 60
    manifest = write(path, n, recipe={"resize": 256}, dataset="MyDataset")
    assert manifest["format_version"] == 2 and manifest["label_field"] == "label"
    assert manifest["preprocessing"]["recipe"] == {"resize": 256}
    assert manifest["preprocessing"]["dataset"] == "MyDataset"
    assert manifest["preprocessing"]["writer"].startswith("kiln.Writer ")
    assert len(manifest["shards"]) > 1, manifest["shards"]
    c = kiln.Cache(path)
    assert c.format_version == 2 and len(c) == n
    assert c.fields == FIELDS, c.fields
    assert c.max_shapes["image"] == (3, 11, 12) and c.max_shapes["boxes"] == (2, 4)
    for i in [0, 1, 2, 17, n - 1, -1]:
        want, got = sample(i % n), c.read(i, verify=True)
        assert list(got) == list(FIELDS), list(got)
        for name, f in FIELDS.items():
            a = got[name]
            assert a.dtype == kiln._NUMPY_DTYPES[f.dtype], (name, a.dtype)
            assert np.array_equal(a, np.asarray(want[name], dtype=a.dtype)), (i, name)
    report = kiln.verify(path)
    assert report["problems"] == [] and report["records_checked"] == n, report
    # A cache copied record by record (0-d arrays for the scalars, as cache[i]
    # gives them) has the same shards.
    copy = os.path.join(tmp, "copy")
    with kiln.Writer(copy, c.fields, classes=c.classes, shard_size=20000,
                     recipe={"resize": 256}, dataset="MyDataset") as w:
        for i in range(n):
            w.append(c[i])
    assert shards(copy) == shards(path), "a copy through cache[i] differs"


def check_bad_samples(tmp):
    """A sample that does not fit is refused naming its record index and field; the
    writer goes on with the next good sample, which takes the index."""
    path = os.path.join(tmp, "c")
    w = kiln.Writer(path, FIELDS)
    w.append(sample(0))
    cases = [
        (dict(sample(1), boxes=np.zeros((2, 4), np.float64)), "field 'boxes': dtype float64"),
        (dict(sample(1), image=np.zeros((4, 5, 5), np.uint8)), "field 'image': shape (4, 5, 5)"),
        (dict(sample(1), mask=np.zeros((5,), np.uint8)), "field 'mask': 1 dims"),
        ({k: v for k, v in sample(1).items() if k != "score"}, "field 'score': missing"),
        (dict(sample(1), extra=1), "field 'extra': not a declared field"),
    ]
    for bad, needle in cases:
        expect_raises(ValueError, lambda: w.append(bad), "record 1", needle)
    assert w.next_index == 1
    # torch tensors and Python numbers are taken as they are.
    s = sample(1)
    s["image"] = torch.from_numpy(s["image"])
    assert w.append(s) == 1
    w.close()
    c = kiln.Cache(path)
    assert len(c) == 2 and np.array_equal(c[1]["image"], sample(1)["image"])
    # A label outside the classes is refused at once too.
    w2 = kiln.Writer(os.path.join(tmp, "d"), FIELDS, classes=["a", "b"])
    expect_raises(ValueError, lambda: w2.append(dict(sample(0), label=7)), "record 0",
                  "field 'label': 7 is outside the 2 classes")
    # Bad declarations, before anything is written.
    expect_raises(ValueError, lambda: kiln.Writer(os.path.join(tmp, "e"),
                                                  {"x": kiln.Field("float64", (2,))}), "float64")
    expect_raises(ValueError, lambda: kiln.Writer(os.path.join(tmp, "e"),
                                                  {"x": kiln.Field("uint8", (0,))}), "at least 1")
    expect_raises(ValueError, lambda: kiln.Writer(os.path.join(tmp, "e"), FIELDS,
                                                  label_field="mask"), "int64 or int32 scalar")


WRITE_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import writer_samples as t
import kiln
path, n, slow = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "slow"
w = kiln.Writer(path, t.FIELDS, classes=["c%d" % k for k in range(5)], shard_size=20000,
                resume=True)
print(w.next_index, flush=True)
for i in range(w.next_index, n):
    w.append(t.sample(i))
    if slow and i == 40:
        print("go", flush=True)
        time.sleep(60)
w.close()
"""


def check_resume_after_kill(tmp):
    """A writer killed (SIGKILL) mid-cache, run again with resume=True,
    continues after its committed records and ends with the same shard bytes
    as a writer that was never interrupted."""
    straight = os.path.join(tmp, "straight")
    write(straight, 90)
    path = os.path.join(tmp, "resumed")
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-c", WRITE_CHILD, here, path, "90"]
    p = subprocess.Popen(cmd + ["slow"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "0"
    assert p.stdout.readline().strip() == "go"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not os.path.exists(os.path.join(path, "manifest.json"))
    expect_raises(RuntimeError, lambda: kiln.Cache(path), "incomplete")
    out = subprocess.run(cmd + ["fast"], stdout=subprocess.PIPE, text=True, check=True).stdout
    resumed_from = int(out.split()[0])
    assert 0 < resumed_from <= 41, resumed_from
    assert shards(path) == shards(straight), "resumed shards differ from a straight write"
    m1 = json.load(open(os.path.join(path, "manifest.json")))
    m2 = json.load(open(os.path.join(straight, "manifest.json")))
    assert m1["shards"] == m2["shards"] and m1["fields"] == m2["fields"]


def check_loader_batches_fixed_fields(tmp):
    """kiln.Loader on a format 2 cache of a fixed image field, a label and
    another field yields dicts: the image and label equal to cache reads, the
    other field padded with its lengths; without the other field, (x, y) as
    for kiln build's caches; on a cache whose image size varies it says what
    it needs."""
    path = os.path.join(tmp, "fixed")
    fields = {"label": kiln.Field("int32", ()), "image": kiln.Field("float16", (3, 8, 6)),
              "note": kiln.Field("uint8", (None,))}
    rng = np.random.default_rng(3)
    images = rng.standard_normal((37, 3, 8, 6)).astype(np.float16)
    with kiln.Writer(path, fields, classes=["a", "b", "c"]) as w:
        for i in range(37):
            w.append({"label": i % 3, "image": images[i], "note": np.zeros(i % 4 + 1, np.uint8)})
    loader = kiln.Loader(path, batch_size=8, shuffle=False, workers=2)
    xs, ys, k = [], [], 0
    for b in loader:
        xs.append(b["image"].numpy().copy())  # the batch's slot is refilled later
        ys.append(b["label"].numpy().copy())
        for j in range(len(b["label"])):
            n = k % 4 + 1
            assert int(b["note_lengths"][j]) == n and not b["note"][j].any()
            assert b["note"].shape[1] == max((k - j + i) % 4 + 1 for i in range(len(b["label"])))
            k += 1
    assert np.array_equal(np.concatenate(xs), images)
    assert np.concatenate(ys).tolist() == [i % 3 for i in range(37)]
    plain = os.path.join(tmp, "plain")
    with kiln.Writer(plain, {"label": fields["label"], "image": fields["image"]},
                     classes=["a", "b", "c"]) as w:
        for i in range(37):
            w.append({"label": i % 3, "image": images[i]})
    x, y = next(iter(kiln.Loader(plain, batch_size=8, shuffle=False)))
    assert np.array_equal(x.numpy(), images[:8]) and y.tolist() == [i % 3 for i in range(8)]
    varying = os.path.join(tmp, "varying")
    write(varying, 5)
    expect_raises(ValueError, lambda: kiln.Loader(varying, batch_size=2), "varies in size",
                  "output geometry")


WRITE_DATASET_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import writer_samples as t
import kiln
kiln.write_dataset(t.Samples(120, bad=7, delay=0.05, slow_after=70), sys.argv[2], t.FIELDS,
                   workers=int(sys.argv[3]), classes=["c%d" % k for k in range(5)],
                   shard_size=20000, progress=False)
"""


def check_write_dataset_workers_and_skips(tmp):
    """kiln.write_dataset writes the same bytes with 1 and 3 workers; a sample
    that raises and one that does not fit are skipped, named by index (and
    field), and logged in skipped.tsv; strict=True raises at the first."""
    caches = {}
    for workers in (1, 3):
        path = os.path.join(tmp, "w%d" % workers)
        m = kiln.write_dataset(Samples(50, bad=4, misfit=9), path, FIELDS, workers=workers,
                               classes=["c%d" % k for k in range(5)], shard_size=20000,
                               progress=False)
        assert m["count"] == 48 and m["preprocessing"]["dataset"] == "Samples", m
        caches[workers] = shards(path)
        log = open(os.path.join(path, "skipped.tsv")).read().splitlines()
        assert log[0] == "index\treason" and len(log) == 3, log
        assert log[1].startswith("4\tOSError: cannot read sample 4"), log
        assert log[2].startswith("9\t") and "field 'mask': dtype float64" in log[2], log
    # Slots too small for the larger samples: those travel pickled, the rest
    # through shared memory, and the bytes are the same.
    path = os.path.join(tmp, "small-slots")
    kiln.write_dataset(Samples(50, bad=4, misfit=9), path, FIELDS, workers=2, slot_bytes=600,
                       classes=["c%d" % k for k in range(5)], shard_size=20000, progress=False)
    assert shards(path) == caches[1], "small slots wrote different shards"
    assert caches[1] == caches[3], "1 and 3 workers wrote different shards"
    c = kiln.Cache(os.path.join(tmp, "w3"))
    assert np.array_equal(c[4]["image"], sample(5)["image"])  # record 4 is sample 5
    expect_raises(ValueError, lambda: kiln.write_dataset(
        Samples(20, misfit=3), os.path.join(tmp, "strict"), FIELDS, strict=True,
        progress=False), "sample 3", "field 'mask'")


def check_write_dataset_resume_after_kill(tmp):
    """write_dataset killed (SIGKILL) mid-dataset and run again continues
    after the committed records (skips included) and ends with the same
    shards as an uninterrupted run, with 2 workers."""
    straight = os.path.join(tmp, "straight")
    kiln.write_dataset(Samples(120, bad=7), straight, FIELDS, workers=2,
                       classes=["c%d" % k for k in range(5)], shard_size=20000, progress=False)
    path = os.path.join(tmp, "resumed")
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-c", WRITE_DATASET_CHILD, here, path, "2"]
    p = subprocess.Popen(cmd, start_new_session=True)
    # Killed once the first shards are committed and the rest goes slowly.
    import time
    deadline = time.monotonic() + 120
    while len(glob.glob(os.path.join(path, "shard-*.mdb"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not os.path.exists(os.path.join(path, "manifest.json")), "finished before the kill"
    kiln.write_dataset(Samples(120, bad=7), path, FIELDS, workers=2,
                       classes=["c%d" % k for k in range(5)], shard_size=20000, progress=False)
    assert shards(path) == shards(straight), "resumed shards differ from a straight run"
    assert open(os.path.join(path, "skipped.tsv")).read() == \
        open(os.path.join(straight, "skipped.tsv")).read()


class ValueKinds:
    """Samples whose fields come as every kind a dataset may return: a
    non-contiguous array (a transposed view), a torch tensor, a 0-d array, a
    numpy scalar and a Python int."""

    def __len__(self):
        return 30

    def __getitem__(self, i):
        hwc = (np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3) + i).astype(np.uint8)
        return {"image": hwc.transpose(2, 0, 1), "score": torch.tensor([i, 0.5]),
                "w": np.array(i, dtype=np.int32), "v": np.float32(i / 2), "label": i % 3}


def check_write_dataset_value_kinds(tmp):
    """Every kind of field value comes through the workers (shared memory)
    as it comes without them: the same shards for 0 and 2 workers, nothing
    skipped, the values read back."""
    fields = {"image": kiln.Field("uint8", (3, 5, 7)), "score": kiln.Field("float32", (2,)),
              "w": kiln.Field("int32", ()), "v": kiln.Field("float32", ()),
              "label": kiln.Field("int64", ())}
    got = {}
    for workers in (0, 2):
        path = os.path.join(tmp, "k%d" % workers)
        m = kiln.write_dataset(ValueKinds(), path, fields, workers=workers, progress=False,
                               classes=["a", "b", "c"])
        assert m["count"] == 30, m
        got[workers] = shards(path)
    assert got[0] == got[2], "0 and 2 workers wrote different shards"
    r = kiln.Cache(os.path.join(tmp, "k2"))[7]
    assert np.array_equal(r["image"], ValueKinds()[7]["image"]), r["image"]
    assert r["w"].shape == () and r["w"] == 7 and r["v"] == 3.5 and r["label"] == 1, r
    assert np.array_equal(r["score"], np.array([7, 0.5], np.float32)), r["score"]


class DyingSamples(Samples):
    """Samples whose worker process is killed (SIGKILL) at item `die_at`, the
    first time only (a flag file remembers it)."""

    def __init__(self, n, die_at, flag, **kw):
        super().__init__(n, **kw)
        self.die_at, self.flag = die_at, flag

    def __getitem__(self, i):
        if i == self.die_at and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def check_write_dataset_worker_killed(tmp):
    """A worker process killed mid-dataset stops write_dataset with an error
    naming the sample it owed (no hang); the records before it are kept, and a
    second run ends with the shards of an uninterrupted one."""
    args = dict(classes=["c%d" % k for k in range(5)], shard_size=20000, progress=False)
    straight = os.path.join(tmp, "straight")
    kiln.write_dataset(Samples(90, bad=7), straight, FIELDS, workers=2, **args)
    path, flag = os.path.join(tmp, "killed"), os.path.join(tmp, "flag")
    expect_raises(RuntimeError, lambda: kiln.write_dataset(
        DyingSamples(90, 61, flag, bad=7), path, FIELDS, workers=2, **args),
        "worker process for sample 61 ended", "run again to resume")
    assert not os.path.exists(os.path.join(path, "manifest.json"))
    kiln.write_dataset(DyingSamples(90, 61, flag, bad=7), path, FIELDS, workers=2, **args)
    assert shards(path) == shards(straight), "resumed shards differ from a straight run"


def check_cli_reads_format2(tmp):
    """kiln inspect lists a format 2 cache's fields, kiln verify passes it and
    names the record whose payload was damaged, kiln bench says what a cache
    of varying images needs; the pure-Python reader refuses it clearly."""
    kiln_bin = os.environ.get("KILN_BIN")
    path = os.path.join(tmp, "c")
    write(path, 30)
    here = os.path.dirname(os.path.abspath(__file__))
    fallback = subprocess.run([sys.executable, "-c",
                               "import sys; sys.path.insert(0, sys.argv[1]); import kiln_torch; "
                               "kiln_torch.KilnDataset(sys.argv[2])",
                               os.path.join(here, "..", "..", "tools"), path],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert fallback.returncode != 0 and "kiln.Cache" in fallback.stdout, fallback.stdout
    if not kiln_bin:
        print("  KILN_BIN not set (no kiln build): the CLI part skipped")
        return
    out = subprocess.run([kiln_bin, "inspect", path], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    assert "fields:        7" in out, out
    assert "image  uint8 3x?x? (largest 3x11x12)  [image: what loaders batch]" in out, out
    assert "label  int64 ()  [label]" in out and "writer:" in out, out
    subprocess.run([kiln_bin, "verify", path], check=True, stdout=subprocess.DEVNULL)
    bench = subprocess.run([kiln_bin, "bench", path], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert bench.returncode != 0 and "varies in size" in bench.stdout, bench.stdout
    # Damage one byte of record 12's image where it lies in its shard.
    image = kiln.Cache(path)[12]["image"].tobytes()
    for shard in sorted(glob.glob(os.path.join(path, "shard-*.mdb"))):
        data = bytearray(open(shard, "rb").read())
        at = data.find(image)
        if at >= 0:
            data[at + 5] ^= 0x10
            open(shard, "wb").write(data)
            break
    else:
        raise AssertionError("record 12's image not found in the shards")
    bad = subprocess.run([kiln_bin, "verify", path], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    assert bad.returncode != 0 and "record 12" in bad.stdout, bad.stdout


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
