#!/usr/bin/python3
"""Checks the Python module kiln (python/kiln over the extension kiln._kiln).

Usage: test_kiln_module.py SYNTH_BIN DUMP_RECORDS_BIN DUMP_BATCHES_BIN CHECK
(module_common.py says what they are).
"""
import gc
import json
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import time
import warnings

from module_common import (SKIP, N, DUMP_RECORDS, np, torch, kiln, synth, cpp_batches,
                           parse_dump, py_batches, expect_raises, run)


# ---- the checks ------------------------------------------------------------

def check_cache_reads(tmp):
    """kiln.Cache: the manifest's fields, and cache[i] equal to kiln::CacheReader's bytes."""
    for dtype, np_dtype in (("uint8", np.uint8), ("float16", np.float16),
                            ("float32", np.float32)):
        path = synth(tmp, dtype, dtype)
        c = kiln.Cache(path)
        assert (len(c), c.count, c.shape, c.dtype) == (N, N, (3, 12, 10), dtype), repr(c)
        assert c.classes == ["class%d" % i for i in range(10)], c.classes
        assert c.manifest["count"] == N
        if dtype == "uint8":
            assert c.preprocessing == {"mean": [0.5] * 3, "std": [0.25] * 3}, c.preprocessing
        dump = os.path.join(tmp, dtype + ".records")
        subprocess.run([DUMP_RECORDS, path, dump], check=True)
        data, pos = open(dump, "rb").read(), 0
        while pos < len(data):
            index, label, n = struct.unpack_from("<QqQ", data, pos)
            pos += 24
            rec = c[index]
            assert list(rec) == ["image", "label"], list(rec)
            arr, lab = rec["image"], int(rec["label"])
            assert rec["label"].dtype == np.int64 and rec["label"].shape == ()
            assert arr.dtype == np_dtype and arr.shape == (3, 12, 10), (arr.dtype, arr.shape)
            assert arr.tobytes() == data[pos:pos + n] and lab == label, "record %d differs" % index
            pos += n
        assert c[-1]["image"].tobytes() == c[N - 1]["image"].tobytes()
        assert c.format_version == 1 and c.fields == {
            "image": kiln.Field(dtype, (3, 12, 10)), "label": kiln.Field("int64", ())}, c.fields
        expect_raises(IndexError, lambda: c[N], str(N))
    expect_raises(FileNotFoundError, lambda: kiln.Cache(os.path.join(tmp, "nothing")), "nothing")


def check_matches_cpp_loader(tmp):
    """Batches from Python equal kiln::Loader's byte for byte, in several configurations."""
    configs = [
        dict(batch=16, seed=7, rank=1, world=3, shuffle=1, drop_last=0, crop=8, random_crop=1,
             flip=1, epoch=2, start=0),
        dict(batch=10, seed=0, rank=0, world=1, shuffle=0, drop_last=0, crop=8, random_crop=0,
             flip=0, epoch=0, start=0),
        dict(batch=9, seed=3, rank=0, world=2, shuffle=1, drop_last=1, crop=0, random_crop=0,
             flip=1, epoch=5, start=2),
        dict(batch=32, seed=11, rank=0, world=1, shuffle=1, drop_last=0, crop=0, random_crop=0,
             flip=0, epoch=1, start=0),
    ]
    for dtype in ("uint8", "float16", "float32"):
        path = synth(tmp, dtype, dtype)
        for cfg in configs:
            data = cpp_batches(path, workers=3, **cfg)
            loader = kiln.Loader(path, batch_size=cfg["batch"], shuffle=bool(cfg["shuffle"]),
                                 seed=cfg["seed"], rank=cfg["rank"], world_size=cfg["world"],
                                 drop_last=bool(cfg["drop_last"]), workers=2,
                                 crop=cfg["crop"] or None, random_crop=bool(cfg["random_crop"]),
                                 flip=bool(cfg["flip"]), epoch=cfg["epoch"],
                                 start_batch=cfg["start"])
            sample = int(np.prod(loader.sample_shape)) * np.dtype(
                {"uint8": "u1", "float16": "f2", "float32": "f4"}[dtype]).itemsize
            want = parse_dump(data, sample)
            got = [(x, y) for x, y in py_batches(loader)]
            assert len(want) == len(got) == len(loader) - cfg["start"], \
                (dtype, cfg, len(want), len(got), len(loader))
            for (index, labels, x), (gx, gy) in zip(want, got):
                assert gx == x and gy == labels, "%s %r: batch %d differs" % (dtype, cfg, index)
            if cfg["shuffle"]:  # the seed matters: equal batches are not a coincidence
                other = parse_dump(cpp_batches(path, workers=1, **dict(cfg, seed=cfg["seed"] + 1)),
                                   sample)
                assert [b[2] for b in other] != [b[2] for b in want], "seed has no effect"


def check_resume(tmp):
    """state_dict mid-epoch, a new Loader, load_state_dict: the same remaining batches."""
    path = synth(tmp, "f16", "float16")
    kw = dict(batch_size=8, seed=5, crop=8, flip=True, drop_last=False)
    whole = kiln.Loader(path, **kw)
    whole.set_epoch(3)
    full = py_batches(whole)
    first = kiln.Loader(path, **kw)
    first.set_epoch(3)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))  # survives JSON (and torch.save)
    assert (state["epoch"], state["batch"]) == (3, 5), state
    del it, first
    second = kiln.Loader(path, **kw)
    second.load_state_dict(state)
    rest = py_batches(second)
    assert rest == full[5:], "resumed batches differ (%d vs %d)" % (len(rest), len(full) - 5)
    # The pass after the resumed one is epoch 4, as for an uninterrupted loader.
    assert second.epoch == 4 and py_batches(second) == py_batches(whole)
    expect_raises(ValueError, lambda: kiln.Loader(path, **dict(kw, seed=6)).load_state_dict(state),
                  "seed")
    # An iteration left early is continued by the next one.
    part = kiln.Loader(path, **kw)
    part.set_epoch(3)
    got = []
    for i, (x, y) in enumerate(part):
        got.append((x.numpy().tobytes(), y.numpy().tobytes()))
        if i == 2:
            break
    got += py_batches(part)
    assert got == full, "an interrupted and continued epoch differs"


def check_zero_copy(tmp):
    """Batches are views of the loader's ring (no copy) unless copy=True."""
    path = synth(tmp, "f16", "float16")
    loader = kiln.Loader(path, batch_size=8, workers=2, shuffle=False)
    ring = loader._ring[0]
    lo = ring.data_ptr()
    hi = lo + ring.numel() * ring.element_size()
    it = iter(loader)
    x, y = next(it)
    assert lo <= x.data_ptr() < hi, "x is not in the ring"
    assert x.storage().data_ptr() == ring.storage().data_ptr()
    kept = x.numpy().tobytes()
    assert kept == kiln.Cache(path)[0]["image"].tobytes() + b"".join(
        kiln.Cache(path)[i]["image"].tobytes() for i in range(1, 8))
    for _ in range(loader.slots):  # the slot goes back and is refilled with later batches
        next(it)
    assert x.numpy().tobytes() != kept, "the slot of an old batch was not reused: not a view?"
    copied = kiln.Loader(path, batch_size=8, workers=2, shuffle=False, copy=True)
    cring = copied._ring[0]
    it = iter(copied)
    x, _ = next(it)
    kept = x.numpy().tobytes()
    assert not (cring.data_ptr() <= x.data_ptr() < cring.data_ptr() + cring.numel() * 2)
    for _ in range(copied.slots):
        next(it)
    assert x.numpy().tobytes() == kept, "copy=True batch changed"


def flip_file_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def check_corrupt_record_raises(tmp):
    """A damaged record raises CorruptionError naming shard and record, never yields."""
    path = synth(tmp, "f32", "float32")
    shard = os.path.join(path, "shard-00000.mdb")
    bad = 20
    payload = kiln.Cache(path)[bad]["image"].tobytes()
    blob = open(shard, "rb").read()
    off = blob.find(payload)
    assert off > 64 and blob.find(payload, off + 1) < 0, "record payload not found once"
    # A payload bit flip: caught with verify=True (checksums).
    flip_file_byte(shard, off + 100)
    loader = kiln.Loader(path, batch_size=8, shuffle=False, verify=True, drop_last=False)
    it = iter(loader)
    for _ in range(2):  # batches 0 and 1 hold records 0..15
        next(it)
    msg = expect_raises(kiln.CorruptionError, lambda: next(it), "shard-00000.mdb", "record 20")
    assert isinstance(kiln.CorruptionError("x"), ValueError)
    expect_raises(kiln.CorruptionError, lambda: kiln.Cache(path).read(bad, verify=True),
                  "record 20", "checksum")
    print("  raised: %s" % msg)
    # The header's magic: caught always, by the loader and by cache[i].
    flip_file_byte(shard, off + 100)
    flip_file_byte(shard, off - 64)
    loader = kiln.Loader(path, batch_size=8, shuffle=False, drop_last=False)
    seen = []
    try:
        for x, y in loader:
            seen.append(x)
        raise AssertionError("the epoch ended without an error")
    except kiln.CorruptionError as e:
        assert "shard-00000.mdb" in str(e) and "record 20" in str(e), str(e)
    assert len(seen) == 2, "%d batches before the bad one" % len(seen)
    expect_raises(kiln.CorruptionError, lambda: kiln.Cache(path)[bad], "record 20")
    it = iter(loader)  # the retry starts at the bad batch and fails again
    expect_raises(kiln.CorruptionError, lambda: next(it), "record 20")


def check_two_ranks_cover_epoch(tmp):
    """Ranks 0 and 1 of 2 together yield every record; RANK/WORLD_SIZE are read."""
    path = synth(tmp, "u8", "uint8")
    cache = kiln.Cache(path)
    index_of = {cache[i]["image"].tobytes(): i for i in range(N)}
    assert len(index_of) == N
    seen = []
    for rank in (0, 1):
        loader = kiln.Loader(path, batch_size=10, seed=9, rank=rank, world_size=2,
                             drop_last=False)
        mine = []
        for x, y in loader:
            for j in range(x.shape[0]):
                i = index_of[x[j].numpy().tobytes()]
                assert int(y[j]) == i % 10, "label of record %d" % i
                mine.append(i)
        assert len(mine) == (N + 1) // 2 and mine == loader.epoch_order(0), rank
        seen += mine
    assert sorted(set(seen)) == list(range(N)), "records missing: %s" % (
        sorted(set(range(N)) - set(seen)))
    assert len(seen) == N + 1  # one wrap-around pad, as DistributedSampler
    os.environ.update(RANK="1", WORLD_SIZE="2")
    try:
        env = kiln.Loader(path, batch_size=10, seed=9, drop_last=False)
        assert (env.rank, env.world_size) == (1, 2)
        assert env.epoch_order(0) == mine
        os.environ["RANK"] = "one"
        expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=10), "RANK")
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]


def _child_epoch(path, queue):
    loader = kiln.Loader(path, batch_size=8, seed=2, drop_last=False)
    queue.put(b"".join(x.numpy().tobytes() for x, _ in loader))


def check_fork_child(tmp):
    """A Loader made in a forked child works; the parent's raises there; Cache follows."""
    path = synth(tmp, "f16", "float16")
    parent = kiln.Loader(path, batch_size=8, seed=2, drop_last=False)
    it = iter(parent)
    next(it)  # workers running at the fork
    want = b"".join(x.numpy().tobytes() for x, _ in kiln.Loader(path, batch_size=8, seed=2,
                                                                 drop_last=False))
    cache = kiln.Cache(path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit code says what went wrong
        code = 0
        try:
            os.close(r)
            try:
                iter(parent)
                code = 3
            except RuntimeError as e:
                code = 0 if "fork" in str(e) else 4
            if code == 0 and cache[5]["image"].tobytes() != kiln.Cache(path)[5]["image"].tobytes():
                code = 5
            if code == 0:
                got = b"".join(x.numpy().tobytes() for x, _ in
                               kiln.Loader(path, batch_size=8, seed=2, drop_last=False))
                code = 0 if got == want else 6
            del it, parent  # the inherited objects are dropped without hanging
            gc.collect()
        except BaseException:
            code = 7
        os.write(w, bytes([code]))
        os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    code = os.read(r, 1)
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        "forked child failed with code %r (status %d)" % (code, status)
    assert next(it)[0].shape[0] == 8  # the parent's loader goes on
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_epoch, args=(path, q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0 and got == want, "multiprocessing child: exit %r" % p.exitcode
    # kiln.Cache as a Dataset in a DataLoader with forked workers.
    dl = torch.utils.data.DataLoader(cache, batch_size=16, num_workers=2,
                                     multiprocessing_context="fork")
    # Each record is a dict of fields: the default collate batches each field.
    xs = torch.cat([b["image"] for b in dl])
    assert xs.shape[0] == N and all(xs[i].numpy().tobytes() == cache[i]["image"].tobytes()
                                    for i in range(N))


def check_batch_outlives_iterator(tmp):
    """x, y = next(iter(loader)) stays valid after the iterator is dropped: its
    slot goes back to the workers only when the next batch is taken (and
    after the loader itself is dropped, never). With copy=True the slot goes
    back at once and is refilled ahead."""
    path = synth(tmp, "f16", "float16")
    cache = kiln.Cache(path)
    first = b"".join(cache[i]["image"].tobytes() for i in range(8))
    second = b"".join(cache[i]["image"].tobytes() for i in range(8, 16))
    loader = kiln.Loader(path, batch_size=8, workers=1, slots=1, shuffle=False)
    x, _ = next(iter(loader))  # the iterator is dropped here
    gc.collect()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # a released slot would be refilled by now
        assert x.numpy().tobytes() == first, "the batch changed after its iterator was dropped"
        time.sleep(0.01)
    it = iter(loader)  # a new iteration hands it back: the epoch restarts at batch 1
    assert next(it)[0].numpy().tobytes() == second
    # A temporary loader: its last batch stays valid after the loader is
    # gone (the workers stop without refilling it).
    for _ in range(20):
        x, _ = next(iter(kiln.Loader(path, batch_size=8, workers=2, slots=1, shuffle=False)))
        gc.collect()
        assert x.numpy().tobytes() == first, "a dropped loader refilled the batch it handed out"
    copied = kiln.Loader(path, batch_size=8, workers=1, slots=1, shuffle=False, copy=True)
    it = iter(copied)
    x, _ = next(it)
    assert x.numpy().tobytes() == first
    ring = copied._ring[0][0]
    deadline = time.monotonic() + 60.0
    while ring.numpy().tobytes() != second:  # the one slot is refilled while x is held
        assert time.monotonic() < deadline, "copy=True did not hand the slot back"
        time.sleep(0.01)
    assert next(it)[0].numpy().tobytes() == second


def check_verify(tmp):
    """kiln.verify reports an intact cache clean, and a damaged record or
    damaged LMDB pages as problems naming the shard, without crashing."""
    path = synth(tmp, "u8", "uint8", shape=(1, 28, 28), n=400)
    r = kiln.verify(path)
    assert r["clean"] and r["records_checked"] == 400 and r["problems"] == [], r
    assert kiln.verify(path, level="quick")["clean"]
    shard = os.path.join(path, "shard-00000.mdb")
    good = open(shard, "rb").read()
    cache = kiln.Cache(path)  # open in this process while verify reads the same shard
    x = cache[7]["image"]
    at = good.find(x.tobytes()[:64])
    assert at > 0
    bad = bytearray(good)
    bad[at + 100] ^= 0x40
    open(shard, "wb").write(bad)
    r = kiln.verify(path)
    assert not r["clean"] and [(p["shard"], p["index"]) for p in r["problems"]] == \
        [("shard-00000.mdb", 7)], r
    assert kiln.verify(path, level="quick")["clean"]  # headers only: the payload is not read
    bad = bytearray(good)
    bad[2 * 4096 + 12:2 * 4096 + 14] = b"\x04\x00"  # page 2's lower bound inside its header
    open(shard, "wb").write(bad)
    r = kiln.verify(path, level="quick")
    assert not r["clean"] and "LMDB structure damaged: page 2" in r["problems"][0]["what"], r
    try:  # a Loader asked to verify proves the structure before its workers read
        kiln.Loader(path, batch_size=8, verify=True)
        raise AssertionError("Loader(verify=True) took a shard with damaged LMDB pages")
    except kiln.CorruptionError as e:
        assert "shard-00000.mdb" in str(e) and "LMDB structure damaged: page 2" in str(e), e
    bad = bytearray(good)
    bad[16:20] = b"\0\0\0\0"  # meta page 0's magic number
    open(shard, "wb").write(bad)
    try:
        kiln.Cache(path)
        raise AssertionError("a shard with a damaged meta page was opened")
    except kiln.CorruptionError as e:
        assert "shard-00000.mdb: LMDB structure damaged: meta page 0" in str(e), e
    open(shard, "wb").write(good)
    assert kiln.verify(path)["clean"]
    assert next(iter(kiln.Loader(path, batch_size=8, verify=True)))[0].shape[0] == 8
    for call, error in ((lambda: kiln.verify(os.path.join(tmp, "absent")), FileNotFoundError),
                        (lambda: kiln.verify(path, level="deep"), ValueError)):
        try:
            call()
            raise AssertionError("no %s" % error.__name__)
        except error:
            pass


def check_stats(tmp):
    """stats() counts the batches taken and the time next() waited for them."""
    path = synth(tmp, "f16", "float16")
    loader = kiln.Loader(path, batch_size=8, workers=1, slots=1)
    assert loader.stats() == {"batches": 0, "wait_seconds": 0.0, "wait_ms_per_batch": 0.0}
    n = sum(1 for _ in loader)
    st = loader.stats(reset=True)
    # One slot: each next() hands it back and waits while the worker refills it.
    assert n == len(loader) and st["batches"] == n and st["wait_seconds"] > 0, st
    assert st["wait_ms_per_batch"] == 1000.0 * st["wait_seconds"] / n
    assert loader.stats()["batches"] == 0
    next(iter(loader))
    assert loader.stats()["batches"] == 1


def check_normalize(tmp):
    """normalize() of a uint8 batch applies the manifest's mean/std; float caches pass."""
    path = synth(tmp, "u8", "uint8")
    loader = kiln.Loader(path, batch_size=16, crop=8)
    x, _ = next(iter(loader))
    got = loader.normalize(x)
    want = (x.to(torch.float64) / 255.0 - 0.5) / 0.25
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.allclose(got.to(torch.float64), want, atol=1e-5), "normalize is off"
    assert x.dtype == torch.uint8  # the slot itself is left alone
    f16 = kiln.Loader(synth(tmp, "f16", "float16"), batch_size=4)
    y, _ = next(iter(f16))
    assert f16.normalize(y) is y


def check_normalize_matches_float_cache(tmp):
    """normalize() of a uint8 cache kiln build made equals its float32 cache of the same recipe."""
    kiln_bin, photos = os.environ.get("KILN_BIN"), os.environ.get("KILN_SAMPLE_PHOTOS")
    if not kiln_bin or not photos:
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        sys.exit(SKIP)
    src = os.path.join(tmp, "src")
    for i, name in enumerate(sorted(os.listdir(photos))):
        os.makedirs(os.path.join(src, "ab"[i % 2]), exist_ok=True)
        shutil.copy(os.path.join(photos, name), os.path.join(src, "ab"[i % 2], name))
    caches = {}
    for dtype in ("uint8", "float32"):
        caches[dtype] = os.path.join(tmp, dtype)
        subprocess.run([kiln_bin, "build", src, caches[dtype], "--resize", "40", "--crop", "32",
                        "--dtype", dtype, "--norm", "imagenet", "--progress", "none"],
                       check=True, stdout=subprocess.DEVNULL)
    u8, f32 = kiln.Cache(caches["uint8"]), kiln.Cache(caches["float32"])
    assert u8.preprocessing["mean"] == [0.485, 0.456, 0.406], u8.preprocessing
    lu = kiln.Loader(u8, batch_size=len(u8), shuffle=False)
    lf = kiln.Loader(f32, batch_size=len(f32), shuffle=False)
    (xu, yu), (xf, yf) = next(iter(lu)), next(iter(lf))
    got = lu.normalize(xu)
    assert torch.equal(yu, yf) and got.shape == xf.shape
    err = (got - xf).abs().max().item()
    assert err < 1e-5, "normalize differs from kiln build's float32 records by %g" % err


def check_raw_name(tmp):
    """raw_name() turns the escaped names of sources.tsv and the manifest back into the files."""
    assert kiln.raw_name("plain/a.jpg") == b"plain/a.jpg"
    assert kiln.raw_name("\u65e5.png") == "\u65e5.png".encode("utf-8")
    try:
        kiln.raw_name("bad\\q")
        raise AssertionError("a bad escape was accepted")
    except ValueError:
        pass
    kiln_bin, photos = os.environ.get("KILN_BIN"), os.environ.get("KILN_SAMPLE_PHOTOS")
    if not kiln_bin or not photos:
        print("  KILN_BIN / KILN_SAMPLE_PHOTOS not set (no kiln build): skipped")
        sys.exit(SKIP)
    src = os.path.join(os.fsencode(tmp), b"src")
    names = [b"caf\xe9/tab\there.jpg", b"caf\xe9/line\nbreak.jpg", b"caf\xe9/back\\slash.jpg",
             b"plain/ok.jpg"]
    photo = os.path.join(photos, sorted(os.listdir(photos))[0])
    for n in names:
        os.makedirs(os.path.dirname(os.path.join(src, n)), exist_ok=True)
        shutil.copy(photo, os.path.join(src, n))
    out = os.path.join(tmp, "c")
    subprocess.run([kiln_bin, "build", src, out, "--resize", "40", "--crop", "32",
                    "--progress", "none"], check=True, stdout=subprocess.DEVNULL)
    cache = kiln.Cache(out)
    assert [kiln.raw_name(c) for c in cache.classes] == [b"caf\xe9", b"plain"], cache.classes
    with open(os.path.join(out, "sources.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    assert len(rows) == len(names), rows
    assert sorted(kiln.raw_name(r[1]) for r in rows) == sorted(names), rows


def check_pin_memory(tmp):
    """pin_memory=True pins the ring with CUDA; without, it warns and falls back."""
    path = synth(tmp, "f16", "float16")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = kiln.Loader(path, batch_size=8, pin_memory=True)
    x, _ = next(iter(loader))
    if torch.cuda.is_available():
        assert loader.pin_memory and x.is_pinned() and not w
        assert torch.equal(x.cuda(non_blocking=True).cpu(), x)
    else:
        assert not loader.pin_memory and not x.is_pinned()
        assert any("pin_memory" in str(m.message) for m in w), [str(m.message) for m in w]
        print("  no CUDA here: checked the fallback only")


def check_native_bf16(tmp):
    """native_bf16() says what the kernel's CPU flags say (read here on their own)."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    assert kiln.native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"}), sorted(flags)


def check_train_environment(tmp):
    """train_environment() is the environment kiln train starts LibTorch in: its start-up
    'cpu' line, with the caller's environment lacking both, names the same values."""
    env = kiln.train_environment()
    assert env.get("OMP_WAIT_POLICY") == "PASSIVE", env
    assert "glibc.malloc.mmap_threshold=" in env.get("GLIBC_TUNABLES", ""), env
    kiln_bin = os.environ.get("KILN_BIN")
    if not kiln_bin:
        print("  KILN_BIN not set: kiln train's side not checked: skipped")
        sys.exit(SKIP)
    help_text = subprocess.run([kiln_bin, "--help"], stdout=subprocess.PIPE, text=True).stdout
    if "train" not in help_text:
        print("  this kiln has no train (built without LibTorch): skipped")
        sys.exit(SKIP)
    child = {k: v for k, v in os.environ.items() if k not in env}
    cache = synth(tmp, "f32", "float32")
    p = subprocess.run([kiln_bin, "train", "--data", cache, "--model", "mlp", "--epochs", "1",
                        "--max-steps", "1", "--batch-size", "8", "--no-verify"], env=child,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout
    cpu = next((l for l in p.stdout.splitlines() if l.startswith("cpu")), "")
    for name, value in env.items():
        assert "%s=%s" % (name, value) in cpu, (name, value, cpu)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
