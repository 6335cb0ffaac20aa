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
import collections
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

from .writer import Field, Writer, write_dataset

__all__ = ["Cache", "Field", "Loader", "Writer", "CorruptionError", "normalize", "raw_name",
           "native_bf16", "train_environment", "verify", "write_dataset", "__version__"]
__version__ = _kiln.__version__

#: Raised for damaged or inconsistent cache data; the message names the
#: shard file and the record. A subclass of ValueError.
CorruptionError = _kiln.CorruptionError

_NUMPY_DTYPES = {"uint8": np.dtype("u1"), "float16": np.dtype("<f2"),
                 "float32": np.dtype("<f4"), "int32": np.dtype("<i4"), "int64": np.dtype("<i8")}
_TORCH_DTYPES = ({"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32,
                  "int32": torch.int32, "int64": torch.int64}
                 if torch is not None else {})


class Cache:
    """A finished kiln cache: the manifest and random access to records.

    ``len(cache)`` / ``cache.count`` records; ``cache.fields`` maps each
    field's name to its :class:`Field` (dtype name, shape with None where
    the size varies; a cache made by ``kiln build`` has ``image`` and
    ``label``); ``cache.shape`` and ``cache.dtype`` are the image field's
    (shape ``()`` when it varies); ``cache.classes``, ``cache.preprocessing``
    (how the tensors were made), ``cache.manifest`` (all of manifest.json as
    a dict).

    ``cache[i]`` is a dict ``{field name: numpy array}``, a copy of record i
    (negative i counts from the end; a scalar field is a 0-d array), for
    every cache, ``kiln build``'s too: ``cache[i]["image"]``,
    ``int(cache[i]["label"])``. Each record's header is checked against the
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
    #: None for a cache whose records are normalized already (float16,
    #: float32); for a uint8 cache, (mean, std) per channel from its
    #: manifest, as kiln's C++ reader checks them (CorruptionError when they
    #: are missing or do not fit the channels).
    normalization = property(lambda self: self._native.normalization)
    #: 1 for a cache of image + label records (kiln build), 2 for named fields.
    format_version = property(lambda self: self._native.format_version)

    @property
    def fields(self):
        return collections.OrderedDict((name, Field(dtype, tuple(shape)))
                                       for name, dtype, shape, _ in self._native.fields)

    @property
    def max_shapes(self):
        """The largest size each field's dims took over the records (name -> tuple)."""
        return {name: tuple(m) for name, _, _, m in self._native.fields}

    @property
    def torch_dtype(self):
        return _TORCH_DTYPES[self.dtype]

    def __len__(self):
        return self._native.count

    def read(self, index, verify=False):
        """Record `index` as ``{field name: numpy array}``; `verify` checks its checksum."""
        return self._reader().get(int(index), bool(verify))

    def __getitem__(self, index):
        return self.read(index)

    def normalize(self, x):
        """See kiln.normalize: this cache's mean/std applied to a uint8 `x`."""
        return normalize(x, self)

    def __repr__(self):
        return "kiln.Cache(%r: %d records of %s)" % (
            self._path, self.count, ", ".join(
                "%s %s %s" % (n, f.dtype, "x".join("?" if d is None else str(d) for d in f.shape)
                              or "()") for n, f in self.fields.items()))


def raw_name(text):
    r"""The file or class name, as bytes, that kiln wrote escaped into
    sources.tsv, rejects.tsv, duplicates.tsv or the manifest (docs/format.md,
    "Names"): ``\\``, ``\t``, ``\n``, ``\r`` and ``\xNN`` undone by kiln's own
    C++ rule. Ordinary names come back as their UTF-8 bytes; ``os.fsdecode``
    makes a str of them. Text kiln cannot have written raises ValueError."""
    return _kiln.unescape_name(text)


def train_environment():
    """The environment variables ``kiln train`` starts LibTorch in when they
    are unset, as a dict: ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep
    instead of spinning while they wait) and ``GLIBC_TUNABLES`` keeping
    malloc's freed memory for the next step (on the CPU, faulting in fresh
    pages was the larger part of a step). libgomp and glibc read them when
    the process starts, so set them in the command that starts Python::

        env $(python3 -c 'import kiln; print(" ".join(
            "%s=%s" % kv for kv in kiln.train_environment().items()))') python3 train.py
    """
    return dict(_kiln.train_environment())


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
    FileNotFoundError. Each shard's LMDB pages are checked before LMDB
    reads them (Cache and Loader check the tree when they open a cache;
    verify also reads every value's pages and recomputes every checksum):
    verify a cache that was copied or stored on doubtful media before
    training from it."""
    return json.loads(_kiln.verify(os.fspath(path), str(level), int(threads)))


_verify_cache = verify  # for Loader, whose own `verify` argument hides the name


def _norm_tensors(cache, device, view):
    """(scale, shift) tensors on `device` with which ``x * scale - shift`` is
    ``(x / 255 - mean) / std`` for a uint8 cache (the mean and std are the
    manifest's, checked by kiln's C++ reader: kiln.Cache.normalization), or
    None for a cache whose records are normalized already."""
    key = (str(device), view)
    if key not in cache._norm:
        norm = cache.normalization
        if norm is None:
            cache._norm[key] = None
        else:
            mean, std = norm
            scale = torch.tensor([1.0 / (255.0 * s) for s in std], device=device).view(view)
            shift = torch.tensor([m / s for m, s in zip(mean, std)], device=device).view(view)
            cache._norm[key] = (scale, shift)
    return cache._norm[key]


def normalize(x, cache):
    """``(x / 255 - mean[c]) / std[c]`` as float32 on x's device, with the mean
    and std in `cache`'s manifest (a Cache or a Loader). `x` is a uint8 torch
    tensor (C,H,W) or batch (N,C,H,W). Tensors of a cache whose payload is
    already normalized (float16/float32 caches) are returned unchanged. A
    uint8 cache without a mean and std for each channel raises
    CorruptionError, as kiln train refuses it."""
    if isinstance(cache, Loader):
        cache = cache.cache
    view = (-1, 1, 1) if len(cache.shape) == 3 else (1,)
    norm = _norm_tensors(cache, x.device, view)
    if norm is None:
        return x
    return x.to(torch.float32).mul_(norm[0]).sub_(norm[1])


def _readahead_bytes(value):
    if value == "auto":
        return _kiln.AUTO_READAHEAD
    n = int(value)
    if n < 0:
        raise ValueError("kiln.Loader: readahead must be 'auto', 0 or a number of bytes, not %r"
                         % (value,))
    return n


def _record_cuda_event():
    """A fence for a pinned slot the caller may be copying: an event on the
    current CUDA stream (after the copy the caller queued there)."""
    event = torch.cuda.Event()
    event.record()
    return event


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
    WORLD_SIZE, read by kiln's C++ rule, else 0 and 1); `drop_last` (default
    False, as PyTorch's DataLoader: the short last batch is yielded; True
    drops it and, with several ranks, the tail that does not divide);
    `workers` (C++ threads); `crop` (output H = W = crop from CHW records; a
    seeded random window when `random_crop`, which defaults to `shuffle`,
    else the center as torchvision's CenterCrop); `flip` (seeded horizontal
    flip, p = 1/2); `epoch`, `start_batch` (where the first iteration
    begins); `copy`; `pin_memory` (the ring in page-locked memory, so that
    ``x.cuda(non_blocking=True)`` is an asynchronous copy; needs torch with
    CUDA, and warns and falls back to ordinary memory without); `device`
    (the loader copies each batch there itself, see below); `dtype`,
    `channels_last` (with `device`); `verify` (check every record's
    checksum too, slower, and first run ``kiln.verify(path, "quick")``,
    which proves each shard's LMDB pages before anything reads them -
    without it, headers are always checked and the tree is checked at
    open, but a shard changed while it is read fails a batch); `slots`
    (ring size, default workers + 2, + 2 more with pin_memory or a CUDA
    device); `readahead` ("auto": up to 256 MB of upcoming records asked
    of the disk ahead of the workers when the cache is not in memory, less
    when memory is short; 0: off; or bytes).

    Iterating yields ``(x, y)``: x a tensor (batch, C, H, W) of the cache's
    dtype, y int64 labels (numpy arrays when torch is missing). Each full
    pass is one epoch; the next pass is the next epoch (``set_epoch`` sets
    it). An iteration left early is continued by the next ``iter()``.

    device: with ``device="cuda"`` (any torch device) batches come out as
    tensors on that device. On CUDA the loader copies each batch from its
    pinned ring on a side stream, two batches ahead; your current stream
    waits for exactly its batch, and a host slot goes back to the workers
    only when the copy that read it has finished. With `dtype`
    (torch.float32, torch.float16 or torch.bfloat16) a uint8 cache is
    normalized there with the manifest's mean and std, a float cache cast;
    without it x keeps the cache's dtype. ``channels_last=True`` gives NHWC
    strides. ``device="cpu"`` does the same conversions on the CPU.

    Lifetime (host batches, copy=False, the default): x and y are views of
    one slot of the loader's ring - no copy is made. The slot belongs to
    you until you take the next batch from this loader (through any
    iterator of it), or its epoch ends, or a new iteration starts
    (``iter()``, ``set_epoch``, ``load_state_dict``); then the workers
    refill it and x, y change under you. Dropping the iterator alone does
    not hand it back, so ``x, y = next(iter(loader))`` stays valid. Keep a
    batch past that with ``x.clone()``, or pass copy=True to get fresh
    tensors (the slot is then handed back at once). With pin_memory=True,
    ``x.cuda(non_blocking=True)`` on the current stream is safe: when you
    take the next batch, the loader records an event on the current stream
    and does not refill the slot before that event has passed (so the copy
    has read it).

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
                 drop_last=False, workers=2, crop=None, flip=False, epoch=0, start_batch=0,
                 copy=False, pin_memory=False, random_crop=None, verify=False, slots=None,
                 device=None, dtype=None, channels_last=False, readahead="auto"):
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
        env_rank, env_world, _ = _kiln.launch_environment()
        if crop is not None and int(crop) <= 0:
            raise ValueError("kiln.Loader: crop must be a positive size or None, not %r" % (crop,))
        if random_crop is None:
            random_crop = bool(shuffle)
        self._device = self._resolve_device(device, dtype, channels_last)
        self._dtype, self._channels_last = dtype, bool(channels_last)
        o = _kiln.LoaderOptions()
        o.batch_size = int(batch_size)
        o.workers = int(workers)
        o.shuffle = bool(shuffle)
        o.seed = int(seed)
        o.rank = int(env_rank if rank is None else rank)
        o.world_size = int(env_world if world_size is None else world_size)
        o.drop_last = bool(drop_last)
        o.crop = int(crop) if crop else 0
        o.random_crop = bool(random_crop) and bool(crop)
        o.random_flip = bool(flip)
        o.verify_checksums = bool(verify)
        o.readahead_bytes = _readahead_bytes(readahead)
        if o.batch_size <= 0:
            raise ValueError("kiln.Loader: batch_size must be > 0, not %r" % (batch_size,))
        pin = bool(pin_memory) or (self._device is not None and self._device.type == "cuda")
        if pin and (torch is None or not torch.cuda.is_available()):
            warnings.warn("kiln.Loader: pin_memory=True, but torch with CUDA is not available: "
                          "the ring stays in ordinary memory", stacklevel=2)
            pin = False
        self.pin_memory = pin
        nslots = int(slots) if slots is not None else o.workers + (4 if pin else 2)
        if nslots < 1:
            raise ValueError("kiln.Loader: slots must be >= 1, not %r" % (slots,))
        self._settings = {"count": cache.count, "batch_size": o.batch_size, "shuffle": o.shuffle,
                          "seed": o.seed, "world_size": o.world_size, "drop_last": o.drop_last,
                          "crop": o.crop, "random_crop": o.random_crop, "flip": o.random_flip}
        self.rank, self.world_size, self.batch_size = o.rank, o.world_size, o.batch_size
        self._copy = bool(copy)

        shape = tuple(_kiln.output_shape(cache._native, o))  # kiln's geometry, checked there
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
        self._native.set_position(int(epoch), int(start_batch))
        if pin and self._device is None:
            # The caller may copy a batch with non_blocking=True: the slot
            # waits for an event recorded on the current stream when it is
            # handed back (see Lifetime).
            self._native.set_fence_maker(_record_cuda_event)
        self._pid = os.getpid()
        self._generation = 0

    @staticmethod
    def _resolve_device(device, dtype, channels_last):
        if device is None:
            if dtype is not None or channels_last:
                raise ValueError("kiln.Loader: dtype and channels_last convert batches on a "
                                 "device: pass device= too (device='cpu' for the CPU)")
            return None
        if torch is None:
            raise RuntimeError("kiln.Loader(device=...) needs torch")
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("kiln.Loader: device %r, but this torch has no CUDA or this "
                                   "machine no GPU (torch.cuda.is_available() is False); use "
                                   "device='cpu' or leave device out" % (str(device),))
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError("kiln.Loader: dtype must be torch.float32, torch.float16 or "
                             "torch.bfloat16, not %r" % (dtype,))
        return device

    # ---- geometry --------------------------------------------------------

    sample_shape = property(lambda self: tuple(self._native.sample_shape))
    samples_per_epoch = property(lambda self: self._native.samples_per_epoch)
    slots = property(lambda self: len(self._xs))
    ring_bytes = property(lambda self: sum(t.nbytes if torch is None else
                                           t.numel() * t.element_size() for t in self._ring))
    epoch = property(lambda self: self._native.position()[0])
    #: The read-ahead budget in bytes (0: off).
    readahead_bytes = property(lambda self: self._native.readahead_bytes)

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
        ready (and, with pin_memory or a device, until a copy had finished
        reading the slot the batch needed) - kiln train's data-wait figure.
        Compare it with your step time: near zero, the loader keeps up; a
        large share, add ``workers`` or ``slots``."""
        n, wait = self._native.stats(bool(reset))
        return {"batches": n, "wait_seconds": wait,
                "wait_ms_per_batch": 1000.0 * wait / n if n else 0.0}

    def epoch_order(self, epoch):
        """This rank's sample indices of `epoch`, in the order they are loaded."""
        return self._native.epoch_order(int(epoch))

    # ---- position --------------------------------------------------------

    def set_epoch(self, epoch):
        """The next iteration runs epoch `epoch` from its first batch."""
        self._native.set_position(int(epoch), 0)
        self._generation += 1  # a running iteration ends

    def state_dict(self):
        """The position: the epoch and the next batch to yield (a batch already
        yielded counts as consumed), with the settings that fix the order."""
        d = dict(self._settings)
        epoch, batch = self._native.position()
        d.update({"epoch": epoch, "batch": batch})
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
        self._native.set_position(int(state["epoch"]), int(state["batch"]))
        self._generation += 1

    # ---- iteration -------------------------------------------------------

    def __iter__(self):
        if self._pid != os.getpid():
            raise RuntimeError("this kiln.Loader was made in process %d and does not survive "
                               "fork(): make a new kiln.Loader in the child" % self._pid)
        self._generation += 1
        if self._device is not None:
            return self._run_device(self._generation)
        return self._run(self._generation)

    def _check(self, generation):
        if self._generation != generation:
            raise RuntimeError("kiln.Loader: this iterator was superseded by a newer "
                               "iter(loader), set_epoch or load_state_dict")

    def _batch(self, b):
        slot, size, _, _ = b
        x, y = self._xs[slot], self._ys[slot]
        if size != self.batch_size:
            x, y = x[:size], y[:size]
        return x, y

    def _run(self, generation):
        native = self._native
        native.start()
        while True:
            self._check(generation)
            b = native.next()
            if b is None:
                break
            x, y = self._batch(b)
            if self._copy:
                x, y = x.clone() if torch is not None else x.copy(), \
                    y.clone() if torch is not None else y.copy()
                native.hand_back()  # the workers may refill it now
            native.yielded(b[2], b[3])
            yield x, y
        native.epoch_done()
        # No hand-back when the iterator is dropped: the batch it yielded last
        # stays the caller's until the next next() or start (see Lifetime).

    def _convert(self, x):
        """A batch on the loader's device: normalized or cast to `dtype`,
        NHWC strides with channels_last."""
        if self._dtype is not None:
            norm = _norm_tensors(self.cache, x.device,
                                 (1, -1, 1, 1) if x.dim() == 4 else (1,))
            if norm is not None:  # in float32, as kiln.normalize, then the dtype asked
                x = x.to(torch.float32).mul_(norm[0]).sub_(norm[1])
            x = x.to(self._dtype)
        if self._channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _launch(self, ahead):
        """Takes the next batch from the workers and starts its copy to the
        device; the host slot goes back once the copy has read it. False at
        the end of the epoch."""
        native, dev = self._native, self._device
        b = native.next()
        if b is None:
            return False
        x, y = self._batch(b)
        if dev.type == "cuda":
            side = self._side_stream
            with torch.cuda.stream(side):
                dx = x.to(dev, non_blocking=True)
                dy = y.to(dev, non_blocking=True)
                read = torch.cuda.Event()
                read.record(side)
                dx = self._convert(dx)
                ready = torch.cuda.Event()
                ready.record(side)
            native.hand_back(read)
        else:
            dx, dy = self._convert(x.to(dev, copy=True)), y.to(dev, copy=True)
            ready = None
            native.hand_back()
        ahead.append((dx, dy, ready, b[2], b[3]))
        return True

    def _run_device(self, generation):
        native, dev = self._native, self._device
        if dev.type == "cuda" and getattr(self, "_side_stream", None) is None:
            self._side_stream = torch.cuda.Stream(device=dev)
        depth = 2 if dev.type == "cuda" else 1
        native.start()
        ahead = collections.deque()
        while len(ahead) < depth and self._launch(ahead):
            pass
        while ahead:
            self._check(generation)
            dx, dy, ready, epoch, index = ahead.popleft()
            self._launch(ahead)  # the next copy runs while this batch is used
            if ready is not None:
                current = torch.cuda.current_stream(dev)
                current.wait_event(ready)
                dx.record_stream(current)
                dy.record_stream(current)
            native.yielded(epoch, index)
            yield dx, dy
        native.epoch_done()

    def __reduce__(self):
        raise TypeError("a kiln.Loader cannot be pickled (it owns threads and a ring of "
                        "buffers): make one in each process, or pass a kiln.Cache instead")

    def __repr__(self):
        return "kiln.Loader(%r, batch_size=%d, rank %d of %d, %d batches per epoch)" % (
            self.cache.path, self.batch_size, self.rank, self.world_size, len(self))
