#!/usr/bin/python3
"""Checks how kiln.Loader hands batches over: slots that wait for the copy
reading them, batches delivered on a device, and the facts the Python
package takes from kiln's C++ core instead of computing them again.

Usage: test_loader_handoff.py SYNTH_BIN DUMP_RECORDS_BIN DUMP_BATCHES_BIN CHECK
(module_common.py says what they are).
"""
import os
import sys
import time

from module_common import N, torch, kiln, synth, py_batches, expect_raises, run


class FakeFence:
    """A copy's "finished?" in the test's hands: query() answers `done`;
    synchronize() (the loader must wait) runs `on_wait`, then finishes it."""

    def __init__(self, on_wait=None):
        self.done, self.waited, self.on_wait = False, False, on_wait

    def query(self):
        return self.done

    def synchronize(self):
        if self.on_wait is not None:
            self.on_wait(self)
        self.waited = self.done = True


def check_release_waits_for_copy(tmp):
    """A batch handed back with a fence whose copy has not finished is not
    refilled: not when the workers have nothing else to do, and not when the
    loader needs its slot again - then next() waits on the fence first."""
    path = synth(tmp, "u8", "uint8", n=100)
    loader = kiln.Loader(path, batch_size=10, shuffle=False, workers=1, slots=3)
    fences = []
    held = {}  # fence -> (the view the batch was yielded as, its bytes then)
    seen_intact = []

    def on_wait(fence):  # the loader is about to refill this slot
        if id(fence) in held:
            view, data = held[id(fence)]
            seen_intact.append(view.numpy().tobytes() == data)

    def make():
        fences.append(FakeFence(on_wait))
        return fences[-1]

    loader._native.set_fence_maker(make)  # what pin_memory=True sets up with CUDA events
    it = iter(loader)
    batches = []
    for k in range(3):  # slots 0, 1, 2
        x, _ = next(it)
        batches.append((x, x.numpy().tobytes()))
        if k > 0:  # taking batch k handed batch k-1 back with a fence
            held[id(fences[-1])] = batches[k - 1]
    assert len(fences) == 2 and not any(f.done for f in fences)
    time.sleep(0.3)  # a worker free to refill would have done it by now
    for x, data in batches:
        assert x.numpy().tobytes() == data, "a slot was refilled while its copy was pending"
    # Batch 3 goes into slot 0, whose fence has not finished: next() waits on it.
    x3, _ = next(it)
    held[id(fences[-1])] = batches[2]
    assert fences[0].waited and seen_intact == [True], (fences[0].waited, seen_intact)
    assert x3.data_ptr() == batches[0][0].data_ptr()
    cache = kiln.Cache(path)
    assert x3.numpy().tobytes() == b"".join(cache[i]["image"].tobytes() for i in range(30, 40)), \
        "batch 3 is not records 30..39"
    # A fence found finished by query() releases its slot without a wait.
    fences[1].done = True
    x4, _ = next(it)
    assert not fences[1].waited and x4.data_ptr() == batches[1][0].data_ptr()
    assert loader.stats()["batches"] == 5
    # The rest of the epoch, and a new one, hand every slot back.
    for f in fences:
        f.done = True
    rest = sum(1 for _ in it)
    assert rest == 5, rest
    assert sum(1 for _ in loader) == 10


def check_device_cpu_matches_host(tmp):
    """device="cpu" yields the batches of a plain loader; with dtype they are
    normalized as kiln.normalize does, with channels_last NHWC."""
    path = synth(tmp, "u8", "uint8")
    kw = dict(batch_size=16, seed=3, crop=8, flip=True)
    plain = py_batches(kiln.Loader(path, **kw))
    dev = kiln.Loader(path, device="cpu", **kw)
    assert py_batches(dev) == plain
    norm = kiln.Loader(path, device="cpu", dtype=torch.float32, channels_last=True, **kw)
    host = kiln.Loader(path, **kw)
    n = 0
    for (x, y), (hx, hy) in zip(norm, host):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, host.normalize(hx)) and torch.equal(y, hy)
        n += 1
    assert n == len(host) == (N + 15) // 16
    bf = kiln.Loader(path, device="cpu", dtype=torch.bfloat16, **kw)
    x, _ = next(iter(bf))
    assert x.dtype == torch.bfloat16
    # The position counts the batches yielded (the same as without device).
    it = iter(dev)
    next(it)
    next(it)
    assert dev.state_dict()["batch"] == 2


def check_device_errors(tmp):
    """device="cuda" without CUDA, and channels_last without a device, are
    clear errors; dtype without a device normalizes a uint8 cache in the
    workers, to the values kiln.normalize gives within float16's rounding."""
    path = synth(tmp, "u8", "uint8")
    if not torch.cuda.is_available():
        expect_raises(RuntimeError, lambda: kiln.Loader(path, batch_size=8, device="cuda"),
                      "cuda", "no CUDA", "device='cpu'")
    expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=8, channels_last=True),
                  "device=")
    raw = kiln.Loader(path, batch_size=8, shuffle=False)
    x8, _ = next(iter(raw))
    for dtype in (torch.float16, torch.float32):
        x, _ = next(iter(kiln.Loader(path, batch_size=8, shuffle=False, dtype=dtype)))
        assert x.dtype == dtype and x.shape == x8.shape, (x.dtype, x.shape)
        want = raw.normalize(x8.clone()).float()
        assert (x.float() - want).abs().max().item() < 2e-3 * max(1.0, want.abs().max().item())
    expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=8, device="cpu",
                                                  dtype=torch.int32), "dtype")


def check_drop_last_default(tmp):
    """drop_last defaults to False, as PyTorch's DataLoader: every sample of an
    evaluation pass is yielded, the short last batch too."""
    path = synth(tmp, "u8", "uint8")  # N = 103 records
    loader = kiln.Loader(path, batch_size=10, shuffle=False)
    sizes = [len(y) for _, y in loader]
    assert sum(sizes) == N and sizes[-1] == 3 and len(loader) == 11, sizes
    two = [kiln.Loader(path, batch_size=10, shuffle=False, rank=r, world_size=2)
           for r in range(2)]
    assert sum(sum(len(y) for _, y in l) for l in two) == 104  # one padded, as DistributedSampler


def check_facts_from_cpp(tmp):
    """Shapes, normalization, names and the launcher's ranks come from kiln's
    C++ core: Python agrees with it because it asks it."""
    path = synth(tmp, "u8", "uint8", shape=(3, 12, 10))
    cache = kiln.Cache(path)
    assert cache.normalization == ([0.5] * 3, [0.25] * 3), cache.normalization
    assert kiln.Cache(synth(tmp, "f16", "float16")).normalization is None
    loader = kiln.Loader(path, batch_size=4, crop=8)
    assert loader.sample_shape == (3, 8, 8)
    expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=4, crop=11), "crop 11",
                  "3x12x10")
    # raw_name: kiln's C++ rule, which refuses what Python's int(x, 16) took.
    assert kiln.raw_name("a\\x41b") == b"aAb"
    for bad in ("a\\x f", "a\\x+f", "a\\q", "a\\"):
        expect_raises(ValueError, lambda: kiln.raw_name(bad), "escape")
    # RANK / WORLD_SIZE as kiln train reads them.
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    try:
        os.environ.update({"RANK": "1", "WORLD_SIZE": "2"})
        assert kiln.Loader(path, batch_size=4).rank == 1
        os.environ["RANK"] = "+1"
        expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=4), "RANK=+1")
        os.environ["RANK"] = "2"
        expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=4), "RANK=2", "0..1")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_readahead_option(tmp):
    """readahead="auto" resolves to a budget; 0 turns it off; batches are the same."""
    path = synth(tmp, "f16", "float16")
    auto = kiln.Loader(path, batch_size=8, seed=1)
    off = kiln.Loader(path, batch_size=8, seed=1, readahead=0)
    small = kiln.Loader(path, batch_size=8, seed=1, readahead=1 << 16)
    assert 0 < auto.readahead_bytes <= 256 << 20 and off.readahead_bytes == 0
    assert small.readahead_bytes == 1 << 16
    assert py_batches(auto) == py_batches(off) == py_batches(small)
    expect_raises(ValueError, lambda: kiln.Loader(path, batch_size=8, readahead=-1), "readahead")


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
