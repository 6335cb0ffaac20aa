"""kiln from Python: read a kiln cache with the C++ loader.

::

    import kiln, torch
    loader = kiln.Loader("cache/train", batch_size=256, crop=224, flip=True)
    for epoch in range(10):                 # each full pass is the next epoch
        for x, y in loader:                 # x: (256, 3, 224, 224) torch tensor, y: int64
            x = loader.normalize(x.cuda(non_blocking=True))   # uint8 caches only
            ...

``kiln.Cache(path)`` reads records one at a time (and is a map-style
Dataset for torch's DataLoader, also in forked or spawned workers);
``kiln.Loader`` is kiln's own loader: C++ worker threads copy records from
the memory-mapped shards straight into a ring of batch buffers, with the
seeded shuffle, rank partition, resume and fused crop/flip of ``kiln
train``. It needs no DataLoader and no worker processes.

This package wraps the compiled extension ``kiln._kiln`` (built by kiln's
CMake, or by ``pip install ./python``). Where no compiler is at hand,
``tools/kiln_torch.py`` reads the same caches in pure Python (slower).
"""
import json
import os
import warnings

try:
    from . import _kiln
except ImportError as _e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "kiln: the compiled module kiln._kiln is missing or does not load (%s). Build it with "
        "kiln's CMake (KILN_WITH_PYTHON, needs python3-dev and pybind11-dev) and put "
        "build/python on PYTHONPATH, or run `pip install ./python`; without a compiler, "
        "tools/kiln_torch.py reads a cache in pure Python." % (_e,)) from None

import numpy as np

try:
    import torch
except ImportError:  # the loader then yields numpy arrays
    torch = None

__all__ = ["Cache", "Loader", "CorruptionError", "normalize", "raw_name", "native_bf16",
           "verify", "__version__"]
__version__ = _kiln.__version__

#: Raised for damaged or inconsistent cache data; the message names the
#: shard file and the record. A subclass of ValueError.
CorruptionError = _kiln.CorruptionError

_NUMPY_DTYPES = {"uint8": np.dtype("u1"), "float16": np.dtype("<f2"),
                 "float32": np.dtype("<f4")}
_TORCH_DTYPES = ({"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}
                 if torch is not None else {})


class Cache:
    """A finished kiln cache: the manifest and random access to records.

    ``len(cache)`` / ``cache.count`` records of ``cache.shape`` and
    ``cache.dtype`` (the name: "uint8", "float16" or "float32");
    ``cache.classes``, ``cache.preprocessing`` (how the tensors were made),
    ``cache.manifest`` (all of manifest.json as a dict).

    ``cache[i]`` is ``(numpy array, label)``, a copy of record i (negative i
    counts from the end). Each record's header is checked against the
    manifest; ``cache.read(i, verify=True)`` also checks its checksum. A bad
    record raises CorruptionError naming the shard and record.

    Opening reads only the manifest and maps the shards. A Cache can be
    pickled (only its path travels) and used in a forked child: the shards
    are opened again in each new process on first use.
    """

    def __init__(self, path):
        self._path = os.fspath(path)
        self._open()

    def _open(self):
        self._native = _kiln.Cache(self._path)
        self._pid = os.getpid()
        self._manifest = json.loads(self._native.manifest_json)
        self._preprocessing = json.loads(self._native.preprocessing_json)
        self._norm = {}

    def _reader(self):
        if self._pid != os.getpid():  # a forked child: its own handles
            self._open()
        return self._native

    def __getstate__(self):
        return {"path": self._path}

    def __setstate__(self, state):
        self._path = state["path"]
        self._open()

    path = property(lambda self: self._path)
    count = property(lambda self: self._native.count)
    shape = property(lambda self: tuple(self._native.shape))
    dtype = property(lambda self: self._native.dtype)
    classes = property(lambda self: list(self._native.classes))
    preprocessing = property(lambda self: dict(self._preprocessing))
    manifest = property(lambda self: json.loads(json.dumps(self._manifest)))

    @property
    def torch_dtype(self):
        return _TORCH_DTYPES[self.dtype]

    def __len__(self):
        return self._native.count

    def read(self, index, verify=False):
        """``(numpy array, label)`` of record `index`; `verify` checks its checksum."""
        return self._reader().get(int(index), bool(verify))

    def __getitem__(self, index):
        return self.read(index)

    def normalize(self, x):
        """See kiln.normalize: this cache's mean/std applied to a uint8 `x`."""
        return normalize(x, self)

    def __repr__(self):
        return "kiln.Cache(%r: %d x %s %s)" % (self._path, self.count,
                                               "x".join(map(str, self.shape)), self.dtype)


_ESCAPES = {"\\": b"\\", "t": b"\t", "n": b"\n", "r": b"\r"}


def raw_name(text):
    r"""The file or class name, as bytes, that kiln wrote escaped into
    sources.tsv, rejects.tsv, duplicates.tsv or the manifest (docs/format.md,
    "Names"): ``\\``, ``\t``, ``\n``, ``\r`` and ``\xNN`` undone. Ordinary
    names come back as their UTF-8 bytes; ``os.fsdecode`` makes a str of them."""
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        nxt = text[i + 1:i + 2]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt]
            i += 2
        elif nxt == "x" and len(text[i + 2:i + 4]) == 2:
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError("%r: bad escape at %d (kiln writes \\\\, \\t, \\n, \\r, \\xNN)"
                             % (text, i))
    return bytes(out)


def native_bf16():
    """True where this CPU computes bf16 natively (AVX512-BF16 or AMX, as
    /proc/cpuinfo lists them). There, training on the CPU under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` runs about twice as fast
    as fp32; elsewhere bf16 is emulated and slower. ``kiln train
    --precision auto`` decides by the same test."""
    return _kiln.cpu_has_native_bf16()


def verify(path, level="full", threads=0):
    """``kiln verify PATH --level LEVEL --json`` from Python: a dict with
    ``clean`` (bool), ``records_checked``, ``bytes_checked``, ``shard_bytes``,
    ``seconds`` and ``problems`` (each ``{"shard", "index", "what"}``; index
    None for a problem that is not one record's). `level`: "quick" (every
    record's header, each shard's LMDB structure, counts) or "full" (also
    every checksum and NaN/Inf); `threads` 0 = all cores. A damaged cache is
    a report with clean False, not an exception; a missing directory raises
    FileNotFoundError. Each shard's LMDB pages are checked before LMDB reads
    them, so a damaged shard is reported where opening it with Cache or
    Loader could crash the interpreter: verify a cache that was copied or
    stored on doubtful media before training from it."""
    return json.loads(_kiln.verify(os.fspath(path), str(level), int(threads)))


_verify_cache = verify  # for Loader, whose own `verify` argument hides the name


def normalize(x, cache):
    """``(x / 255 - mean[c]) / std[c]`` as float32 on x's device, with the mean
    and std in `cache`'s manifest (a Cache or a Loader). `x` is a uint8 torch
    tensor (C,H,W) or batch (N,C,H,W). Tensors of a cache whose payload is
    already normalized (float16/float32 caches) are returned unchanged."""
    if isinstance(cache, Loader):
        cache = cache.cache
    pre = cache._preprocessing
    if pre.get("normalized", cache.dtype != "uint8"):
        return x
    shape = cache.shape
    channels = shape[0] if len(shape) == 3 else 1
    mean = [float(v) for v in pre.get("mean", [0.0] * channels)]
    std = [float(v) for v in pre.get("std", [1.0] * channels)]
    if len(mean) != channels or len(std) != channels or not all(s > 0 for s in std):
        raise ValueError("%s: mean/std %r/%r do not fit %d channels"
                         % (os.path.join(cache.path, "manifest.json"), mean, std, channels))
    key = (x.device, channels)
    norm = cache._norm.get(key)
    if norm is None:
        view = (channels, 1, 1) if len(shape) == 3 else (1,)
        scale = torch.tensor([1.0 / (255.0 * s) for s in std], device=x.device).view(view)
        shift = torch.tensor([m / s for m, s in zip(mean, std)], device=x.device).view(view)
        norm = cache._norm[key] = (scale, shift)
    return x.to(torch.float32).mul_(norm[0]).sub_(norm[1])


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("kiln.Loader: the environment variable %s=%r is not an integer"
                         % (name, value)) from None


# Settings that decide which samples a batch holds: a state_dict is
# refused by a loader that differs in any of them.
_ORDER_KEYS = ("count", "batch_size", "shuffle", "seed", "world_size", "drop_last", "crop",
               "random_crop", "flip")


class Loader:
    """Batches of a kiln cache filled by kiln's C++ loader.

    Arguments: `path` (a directory or a kiln.Cache); `batch_size`;
    `shuffle` (a seeded permutation per epoch, the same on every machine;
    False: record order); `seed`; `rank`, `world_size` (rank r of W takes
    every W-th sample, as DistributedSampler; default: torchrun's RANK and
    WORLD_SIZE, else 0 and 1); `drop_last` (drop the short last batch and,
    with several ranks, the tail that does not divide); `workers` (C++
    threads); `crop` (output H = W = crop from CHW records; a seeded random
    window when `random_crop`, which defaults to `shuffle`, else the center
    as torchvision's CenterCrop); `flip` (seeded horizontal flip, p = 1/2);
    `epoch`, `start_batch` (where the first iteration begins); `copy`;
    `pin_memory` (the ring in page-locked memory, so that
    ``x.cuda(non_blocking=True)`` is an asynchronous copy; needs torch with
    CUDA, and warns and falls back to ordinary memory without); `verify`
    (check every record's checksum too, slower, and first run
    ``kiln.verify(path, "quick")``, which proves each shard's LMDB pages
    before anything reads them - without it, headers are always checked,
    but a shard whose LMDB pages are damaged can crash the process);
    `slots` (ring size, default workers + 2).

    Iterating yields ``(x, y)``: x a tensor (batch, C, H, W) of the cache's
    dtype, y int64 labels (numpy arrays when torch is missing). Each full
    pass is one epoch; the next pass is the next epoch (``set_epoch`` sets
    it). An iteration left early is continued by the next ``iter()``.

    Lifetime (copy=False, the default): x and y are views of one slot of
    the loader's ring - no copy is made. The slot belongs to you until you
    take the next batch from this loader (through any iterator of it), or
    its epoch ends, or a new iteration starts (``iter()``, ``set_epoch``,
    ``load_state_dict``); then the workers refill it and x, y change under
    you. Dropping the iterator alone does not hand it back, so ``x, y =
    next(iter(loader))`` stays valid. Keep a batch past that with
    ``x.clone()``, or pass copy=True to get fresh tensors (the slot is then
    handed back at once).

    Errors: a record that fails to load raises CorruptionError (naming the
    shard and record) in place of its batch, and again on every retry; no
    batch holding it is ever yielded. The GIL is released while waiting
    for the workers.

    ``len(loader)`` is the number of batches per epoch;
    ``state_dict()``/``load_state_dict()`` save and restore the position
    (epoch and next batch) for a mid-epoch resume, as torchdata's
    StatefulDataLoader does. A Loader does not survive fork(): its worker
    threads stay in the parent, and using it in a child raises RuntimeError;
    make a new Loader in the child.
    """

    def __init__(self, path, batch_size, shuffle=True, seed=0, rank=None, world_size=None,
                 drop_last=True, workers=2, crop=None, flip=False, epoch=0, start_batch=0,
                 copy=False, pin_memory=False, random_crop=None, verify=False, slots=None):
        self.cache = path if isinstance(path, Cache) else Cache(path)
        cache = self.cache
        if verify:
            report = _verify_cache(cache.path, "quick")
            if not report["clean"]:
                p = report["problems"][0]
                raise CorruptionError("kiln.Loader(verify=True): %s: %s: %s (%d problem(s) in all; "
                                      "kiln verify %s lists them)"
                                      % (cache.path, p["shard"], p["what"],
                                         len(report["problems"]), cache.path))
        cache._reader()  # this process's handles
        if rank is None:
            rank = _env_int("RANK", 0)
        if world_size is None:
            world_size = _env_int("WORLD_SIZE", 1)
        if crop is not None and int(crop) <= 0:
            raise ValueError("kiln.Loader: crop must be a positive size or None, not %r" % (crop,))
        if random_crop is None:
            random_crop = bool(shuffle)
        o = _kiln.LoaderOptions()
        o.batch_size = int(batch_size)
        o.workers = int(workers)
        o.shuffle = bool(shuffle)
        o.seed = int(seed)
        o.rank = int(rank)
        o.world_size = int(world_size)
        o.drop_last = bool(drop_last)
        o.crop = int(crop) if crop else 0
        o.random_crop = bool(random_crop) and bool(crop)
        o.random_flip = bool(flip)
        o.verify_checksums = bool(verify)
        if o.batch_size <= 0:
            raise ValueError("kiln.Loader: batch_size must be > 0, not %r" % (batch_size,))
        nslots = int(slots) if slots is not None else o.workers + 2
        if nslots < 1:
            raise ValueError("kiln.Loader: slots must be >= 1, not %r" % (slots,))
        self._settings = {"count": cache.count, "batch_size": o.batch_size, "shuffle": o.shuffle,
                          "seed": o.seed, "world_size": o.world_size, "drop_last": o.drop_last,
                          "crop": o.crop, "random_crop": o.random_crop, "flip": o.random_flip}
        self.rank, self.world_size, self.batch_size = o.rank, o.world_size, o.batch_size
        self._copy = bool(copy)

        shape = cache.shape
        if o.crop and len(shape) == 3:
            shape = (shape[0], o.crop, o.crop)
        pin = bool(pin_memory)
        if pin and (torch is None or not torch.cuda.is_available()):
            warnings.warn("kiln.Loader: pin_memory=True, but torch with CUDA is not available: "
                          "the ring stays in ordinary memory", stacklevel=2)
            pin = False
        self.pin_memory = pin
        if torch is not None:
            x = torch.empty((nslots, o.batch_size) + shape, dtype=_TORCH_DTYPES[cache.dtype],
                            pin_memory=pin)
            y = torch.empty((nslots, o.batch_size), dtype=torch.int64, pin_memory=pin)
            if not pin:
                x.zero_()  # fault the ring in now, not in the first epoch
            addr = [x[i].data_ptr() for i in range(nslots)]
            laddr = [y[i].data_ptr() for i in range(nslots)]
        else:
            x = np.zeros((nslots, o.batch_size) + shape, dtype=_NUMPY_DTYPES[cache.dtype])
            y = np.zeros((nslots, o.batch_size), dtype=np.int64)
            addr = [x[i].ctypes.data for i in range(nslots)]
            laddr = [y[i].ctypes.data for i in range(nslots)]
        slot_bytes = int(np.prod(shape, dtype=np.int64)) * _NUMPY_DTYPES[cache.dtype].itemsize \
            * o.batch_size
        self._ring = (x, y)
        self._xs = [x[i] for i in range(nslots)]
        self._ys = [y[i] for i in range(nslots)]
        self._native = _kiln.Loader(cache._native, o, addr, laddr, slot_bytes, self._ring)
        self._pid = os.getpid()
        self._epoch, self._batch = int(epoch), int(start_batch)
        self._generation = 0

    # ---- geometry --------------------------------------------------------

    sample_shape = property(lambda self: tuple(self._native.sample_shape))
    samples_per_epoch = property(lambda self: self._native.samples_per_epoch)
    slots = property(lambda self: len(self._xs))
    ring_bytes = property(lambda self: sum(t.nbytes if torch is None else
                                           t.numel() * t.element_size() for t in self._ring))
    epoch = property(lambda self: self._epoch)

    def __len__(self):
        return self._native.batches_per_epoch

    def normalize(self, x):
        """See kiln.normalize: the cache's mean/std applied to a uint8 `x`."""
        return normalize(x, self.cache)

    def stats(self, reset=False):
        """How long this loop waited for data: ``{"batches": n,
        "wait_seconds": s, "wait_ms_per_batch": 1000 s / n}`` over the batches
        taken since the loader was made (or the last ``stats(reset=True)``).
        The wait is the time ``next()`` spent until the workers had the batch
        ready - kiln train's data-wait figure. Compare it with your step
        time: near zero, the loader keeps up; a large share, add ``workers``
        or ``slots``."""
        n, wait = self._native.stats(bool(reset))
        return {"batches": n, "wait_seconds": wait,
                "wait_ms_per_batch": 1000.0 * wait / n if n else 0.0}

    def epoch_order(self, epoch):
        """This rank's sample indices of `epoch`, in the order they are loaded."""
        return self._native.epoch_order(int(epoch))

    # ---- position --------------------------------------------------------

    def set_epoch(self, epoch):
        """The next iteration runs epoch `epoch` from its first batch."""
        self._epoch, self._batch = int(epoch), 0
        self._generation += 1  # a running iteration ends

    def state_dict(self):
        """The position: the epoch and the next batch to yield (a batch already
        yielded counts as consumed), with the settings that fix the order."""
        d = dict(self._settings)
        d.update({"epoch": self._epoch, "batch": self._batch})
        return d

    def load_state_dict(self, state):
        """Continue where `state` (from state_dict) left off, at the next
        iteration. Raises ValueError if it came from a loader with other
        settings that decide the order (cache size, batch size, seed, ...)."""
        diff = ["%s: %r in the state, %r here" % (k, state.get(k), self._settings[k])
                for k in _ORDER_KEYS if state.get(k) != self._settings[k]]
        if diff:
            raise ValueError("kiln.Loader.load_state_dict: the state comes from a loader with "
                             "other settings, its batches would differ: " + "; ".join(diff))
        self._epoch, self._batch = int(state["epoch"]), int(state["batch"])
        self._generation += 1

    # ---- iteration -------------------------------------------------------

    def __iter__(self):
        if self._pid != os.getpid():
            raise RuntimeError("this kiln.Loader was made in process %d and does not survive "
                               "fork(): make a new kiln.Loader in the child" % self._pid)
        self._generation += 1
        return self._run(self._generation)

    def _run(self, generation):
        native, xs, ys, full = self._native, self._xs, self._ys, self.batch_size
        native.start_epoch(self._epoch, self._batch)
        while True:
            if self._generation != generation:
                raise RuntimeError("kiln.Loader: this iterator was superseded by a newer "
                                   "iter(loader), set_epoch or load_state_dict")
            b = native.next()
            if b is None:
                break
            slot, size, _, index = b
            self._batch = index + 1
            x, y = xs[slot], ys[slot]
            if size != full:
                x, y = x[:size], y[:size]
            if self._copy:
                x, y = x.clone() if torch is not None else x.copy(), \
                    y.clone() if torch is not None else y.copy()
                native.release()  # the workers may refill it now
            yield x, y
        self._epoch, self._batch = self._epoch + 1, 0
        # No release when the iterator is dropped: the batch it yielded last
        # stays the caller's until the next next() or start_epoch (see Lifetime).

    def __reduce__(self):
        raise TypeError("a kiln.Loader cannot be pickled (it owns threads and a ring of "
                        "buffers): make one in each process, or pass a kiln.Cache instead")

    def __repr__(self):
        return "kiln.Loader(%r, batch_size=%d, rank %d of %d, %d batches per epoch)" % (
            self.cache.path, self.batch_size, self.rank, self.world_size, len(self))
