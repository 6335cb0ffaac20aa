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

__all__ = ["Cache", "Field", "Loader", "RandomResizedCrop", "ResizeCenterCrop", "Writer",
           "CorruptionError", "normalize", "raw_name", "native_bf16", "resolution_at",
           "train_environment", "verify", "merge", "write_dataset", "__version__"]
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
    #: The field the loader makes model inputs of, and the class-index
    #: field (None without one), as kiln's C++ reader names them.
    image_field = property(lambda self: self._native.image_field)
    label_field = property(lambda self: self._native.label_field)
    #: 1 for a cache of image + label records (kiln build), 2 for named fields.
    format_version = property(lambda self: self._native.format_version)

    @property
    def fields(self):
        return collections.OrderedDict((name, Field(dtype, tuple(shape), codec))
                                       for name, dtype, shape, _, codec in self._native.fields)

    @property
    def max_shapes(self):
        """The largest size each field's dims took over the records (name -> tuple)."""
        return {name: tuple(m) for name, _, _, m, _ in self._native.fields}

    @property
    def torch_dtype(self):
        return _TORCH_DTYPES[self.dtype]

    def __len__(self):
        return self._native.count

    def read(self, index, verify=False, decode=True):
        """Record `index` as ``{field name: numpy array}``; `verify` checks its checksum.
        A JPEG field (``Field(..., codec="jpeg")``) is decoded to its uint8 (C, H, W)
        image; with ``decode=False`` it comes as the stored JPEG's bytes (1-d uint8)."""
        return self._reader().get(int(index), bool(verify), bool(decode))

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


def resolution_at(schedule, epoch):
    """The crop size of `epoch` (an index from 0) under a progressive-resizing
    schedule ``"MIN:MAX:START:END[:STEP]"`` - kiln train --res-schedule's, as
    FFCV's min_res/max_res/start_ramp/end_ramp: MIN up to epoch START, MAX from
    END on, in between the linear ramp rounded to a multiple of STEP (32)::

        loader = kiln.Loader(path, 256, crop=kiln.RandomResizedCrop(160), max_resolution=192)
        for epoch in range(epochs):
            loader.set_resolution(kiln.resolution_at("160:192:0:2", epoch))
            loader.set_epoch(epoch)
            ...
    """
    return _kiln.resolution_at(str(schedule), int(epoch))


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


def merge(out, caches):
    """``kiln merge --from A --from B OUT`` from Python: the finished caches
    `caches` (two or more, same fields and recipe) joined in that order into
    the new directory `out`, classes matched by name (docs/build.md,
    "Joining finished caches"). Shards are hard-linked, keeping their
    records' keys; a cache whose classes are numbered otherwise gets a
    label map that every reader applies: no record is written again.
    Returns a dict: ``records``, ``shards``, ``rewritten_records`` (0
    here), ``relabelled_records``, ``duplicate_groups``,
    ``duplicate_repeats``, ``duplicates_file``, ``seconds``. Caches that
    differ raise ValueError saying what differs."""
    return _kiln.merge(os.fspath(out), [os.fspath(c) for c in caches])


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
    # The image field's declared dims (a cache of whole images has no one shape).
    view = (-1, 1, 1) if len(cache.fields[cache.image_field].shape) == 3 else (1,)
    norm = _norm_tensors(cache, x.device, view)
    if norm is None:
        return x
    return x.to(torch.float32).mul_(norm[0]).sub_(norm[1])


# The loader lives in its own module; it uses the names above.
from .loader import Loader, RandomResizedCrop, ResizeCenterCrop  # noqa: E402
