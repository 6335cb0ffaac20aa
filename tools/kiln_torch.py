"""Read a kiln cache from PyTorch, in pure Python (lmdb + numpy + torch).

The byte layout is docs/format.md; this module needs none of kiln's code.

Usage::

    import torch
    from kiln_torch import KilnDataset

    ds = KilnDataset("/data/cache/train")          # reads manifest.json only
    print(len(ds), ds.shape, ds.dtype, ds.classes[:3])
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True,
                                         num_workers=2)
    for x, y in loader:                            # x: (32, C, H, W), y: (32,)
        x = ds.normalize(x)                        # uint8 caches: apply mean/std
        ...

The LMDB shards are opened lazily, on the first ``__getitem__`` in each
process (and reopened when the process id changes), so one dataset object can
be handed to DataLoader worker processes, forked or spawned.

``verify=True`` checks each record's XXH3-64 checksum; it needs the Python
``xxhash`` package (>= 2.0, for xxh3_64) and raises RuntimeError without it.
"""
import bisect
import json
import os
import struct

import lmdb
import numpy as np
import torch

try:
    import xxhash as _xxhash
    if not hasattr(_xxhash, "xxh3_64"):
        _xxhash = None
except ImportError:  # verification is optional
    _xxhash = None

__all__ = ["KilnDataset", "HAVE_XXHASH"]

HAVE_XXHASH = _xxhash is not None

FORMAT = "kiln-cache"
FORMAT_VERSION = 1
RECORD_MAGIC = b"KLNR"
RECORD_VERSION = 1
HEADER_SIZE = 64
CHECKSUM_OFFSET = 40
MAX_DIMS = 4
MANIFEST_NAME = "manifest.json"

# code -> (name, numpy dtype, little-endian)
_DTYPES = {
    1: ("uint8", np.dtype("u1")),
    2: ("float16", np.dtype("<f2")),
    3: ("float32", np.dtype("<f4")),
}
_DTYPE_CODES = {name: code for code, (name, _) in _DTYPES.items()}

# magic(4s) version(H) dtype(B) ndim(B) shape(4I) label(q) payload_bytes(Q)
# checksum(Q) reserved(16s): 64 bytes, little-endian, no padding.
_HEADER = struct.Struct("<4sHBB4IqQQ16s")
assert _HEADER.size == HEADER_SIZE



# The shards open in this process, by file: LMDB must not open one file
# twice in a process (python-lmdb 1.x and later refuse: "already open in
# this process"), so every KilnDataset of the same cache shares one handle.
_shards = {}
_shards_pid = None


def _open_shard(path, max_readers):
    global _shards, _shards_pid
    if _shards_pid != os.getpid():
        _shards, _shards_pid = {}, os.getpid()  # a forked child: the parent's handles stay its own
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError("%s: cannot open shard: %s" % (path, e.strerror)) from None
    key = (os.path.realpath(path), st.st_dev, st.st_ino)  # a rebuilt cache is a new file
    env = _shards.get(key)
    if env is None:
        try:
            env = lmdb.open(path, subdir=False, readonly=True, lock=False,
                            readahead=False, max_readers=max_readers)
        except lmdb.Error as e:
            raise ValueError("%s: cannot open shard: %s" % (path, e)) from None
        _shards[key] = env
    return env

class KilnDataset(torch.utils.data.Dataset):
    """The records of a finished kiln cache as ``(tensor, label)`` pairs."""

    def __init__(self, cache_dir, verify=False, max_readers=512):
        self._dir = os.fspath(cache_dir)
        self._verify = bool(verify)
        self._max_readers = int(max_readers)
        if self._verify and _xxhash is None:
            raise RuntimeError(
                "KilnDataset(verify=True) needs the Python xxhash package "
                "(>= 2.0, xxh3_64); install it or pass verify=False")
        self._manifest_path = os.path.join(self._dir, MANIFEST_NAME)
        self._load_manifest()
        self._pid = None
        self._envs = {}

    # ---- manifest -------------------------------------------------------

    def _bad(self, what):
        return ValueError("%s: %s" % (self._manifest_path, what))

    def _load_manifest(self):
        path = self._manifest_path
        if not os.path.isdir(self._dir):
            raise FileNotFoundError("no kiln cache directory: %s" % self._dir)
        if not os.path.exists(path):
            raise ValueError("%s: missing: incomplete kiln cache" % path)
        try:
            with open(path, "rb") as f:
                m = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError("%s: not valid JSON: %s" % (path, e)) from None
        if not isinstance(m, dict):
            raise self._bad("not a JSON object")
        if m.get("format") != FORMAT:
            raise self._bad("format is %r, expected %r" % (m.get("format"), FORMAT))
        if m.get("format_version") != FORMAT_VERSION:
            raise self._bad("format_version is %r, this reader supports %d; read a format 2 "
                            "cache (named fields, written by kiln.Writer) with the compiled "
                            "kiln module (kiln.Cache)" % (m.get("format_version"), FORMAT_VERSION))
        try:
            sample = m["sample"]
            dtype_name = sample["dtype"]
            shape = [int(d) for d in sample["shape"]]
            count = int(m["count"])
            shards = m["shards"]
            classes = list(m.get("classes", []))
            preprocessing = m.get("preprocessing", {})
        except (KeyError, TypeError, ValueError) as e:
            raise self._bad("missing or malformed field: %r" % (e,)) from None
        if dtype_name not in _DTYPE_CODES:
            raise self._bad("unknown sample dtype %r" % (dtype_name,))
        if not 1 <= len(shape) <= MAX_DIMS or any(d <= 0 or d >= 2 ** 32 for d in shape):
            raise self._bad("bad sample shape %r" % (shape,))
        if not isinstance(preprocessing, dict):
            raise self._bad("preprocessing is not an object")
        firsts, counts, files = [], [], []
        expect = 0
        for i, s in enumerate(shards):
            try:
                file, first, n = str(s["file"]), int(s["first"]), int(s["count"])
            except (KeyError, TypeError, ValueError):
                raise self._bad("shard %d: missing or malformed field" % i) from None
            if first != expect or n < 0 or os.path.basename(file) != file:
                raise self._bad("shard %d (%s): first %d count %d: shards must be "
                                "contiguous from 0" % (i, file, first, n))
            firsts.append(first)
            counts.append(n)
            files.append(file)
            expect += n
        if expect != count:
            raise self._bad("count %d differs from the shards' total %d" % (count, expect))

        self._count = count
        self._dtype_code = _DTYPE_CODES[dtype_name]
        self._np_dtype = _DTYPES[self._dtype_code][1]
        self._shape = tuple(shape)
        self._payload_bytes = int(np.prod(shape)) * self._np_dtype.itemsize
        self._classes = classes
        self._preprocessing = preprocessing
        self._firsts, self._counts, self._files = firsts, counts, files

    # ---- properties -----------------------------------------------------

    @property
    def classes(self):
        return list(self._classes)

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        """The torch dtype of the tensors (torch.uint8, float16 or float32)."""
        return {1: torch.uint8, 2: torch.float16, 3: torch.float32}[self._dtype_code]

    @property
    def preprocessing(self):
        return dict(self._preprocessing)

    @property
    def cache_dir(self):
        return self._dir

    def normalize(self, x):
        """Applies the manifest's mean/std to a uint8 tensor (C,H,W) or batch
        (N,C,H,W): ``(x / 255 - mean[c]) / std[c]`` as float32. Tensors of a
        float cache are returned unchanged. This file runs without kiln's
        compiled module, so it cannot call kiln's rule (kiln::InputNormalization,
        kiln.Cache.normalization): it follows it - a uint8 cache must give a
        mean and a positive std per channel, else ValueError."""
        if self._dtype_code != 1:
            return x
        channels = self._shape[0] if len(self._shape) == 3 else 1
        mean = list(self._preprocessing.get("mean", []))
        std = list(self._preprocessing.get("std", []))
        if len(mean) != channels or len(std) != channels or not all(v > 0 for v in std):
            raise ValueError("%s: a uint8 cache needs a mean and a positive std per channel (%d) "
                             "in its preprocessing to be normalized (mean %r, std %r); rebuild it "
                             "with --mean and --std" % (self._manifest_path, channels, mean, std))
        view = (channels,) + (1,) * (len(self._shape) - 1) if len(self._shape) == 3 else (1,)
        m = torch.tensor(mean, dtype=torch.float32).view(view)
        s = torch.tensor(std, dtype=torch.float32).view(view)
        return (x.to(torch.float32) / 255.0 - m) / s

    # ---- records --------------------------------------------------------

    def __len__(self):
        return self._count

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_envs"] = {}  # LMDB handles never cross a process boundary
        state["_pid"] = None
        return state

    def _env(self, shard):
        pid = os.getpid()
        if self._pid != pid:
            # A forked child inherited the parent's handles: drop them without
            # closing (the parent still uses the same maps).
            self._envs = {}
            self._pid = pid
        env = self._envs.get(shard)
        if env is None:
            env = _open_shard(os.path.join(self._dir, self._files[shard]), self._max_readers)
            self._envs[shard] = env
        return env

    def _corrupt(self, shard, index, what):
        return ValueError("%s: shard %s, index %d: %s"
                          % (self._dir, self._files[shard], index, what))

    def read(self, index):
        """Returns ``(tensor, label)`` for record `index` (0 <= index < len)."""
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("index %d out of range for %d records" % (index, self._count))
        shard = bisect.bisect_right(self._firsts, index) - 1
        env = self._env(shard)
        key = struct.pack(">Q", index)
        with env.begin(buffers=True) as txn:
            value = txn.get(key)
            if value is None:
                raise self._corrupt(shard, index, "record missing")
            if len(value) < HEADER_SIZE:
                raise self._corrupt(shard, index, "value of %d bytes is shorter than "
                                    "the %d-byte header" % (len(value), HEADER_SIZE))
            (magic, version, dtype, ndim, s0, s1, s2, s3, label, payload_bytes,
             checksum, reserved) = _HEADER.unpack_from(value, 0)
            if magic != RECORD_MAGIC:
                raise self._corrupt(shard, index, "bad magic %r" % (magic,))
            if version != RECORD_VERSION:
                raise self._corrupt(shard, index, "record version %d, expected %d"
                                    % (version, RECORD_VERSION))
            if dtype != self._dtype_code:
                raise self._corrupt(shard, index, "dtype %d (%s), manifest says %s"
                                    % (dtype, _DTYPES.get(dtype, ("unknown",))[0],
                                       _DTYPES[self._dtype_code][0]))
            dims = (s0, s1, s2, s3)
            if not 1 <= ndim <= MAX_DIMS or any(dims[ndim:]):
                raise self._corrupt(shard, index, "bad ndim %d / shape %r" % (ndim, dims))
            if dims[:ndim] != self._shape:
                raise self._corrupt(shard, index, "shape %r, manifest says %r"
                                    % (dims[:ndim], self._shape))
            if payload_bytes != self._payload_bytes:
                raise self._corrupt(shard, index, "payload_bytes %d, expected %d"
                                    % (payload_bytes, self._payload_bytes))
            if len(value) != HEADER_SIZE + payload_bytes:
                raise self._corrupt(shard, index, "value is %d bytes, expected %d"
                                    % (len(value), HEADER_SIZE + payload_bytes))
            if any(reserved):
                raise self._corrupt(shard, index, "reserved header bytes not zero")
            if self._classes and not 0 <= label < len(self._classes):  # as the C++ reader
                raise self._corrupt(shard, index, "label %d outside the %d classes"
                                    % (label, len(self._classes)))
            if self._verify:
                h = _xxhash.xxh3_64(seed=index)
                h.update(value[:CHECKSUM_OFFSET])
                h.update(value[HEADER_SIZE:])
                if h.intdigest() != checksum:
                    raise self._corrupt(shard, index, "checksum mismatch (stored %016x, "
                                        "computed %016x)" % (checksum, h.intdigest()))
            # The buffer points into the map and dies with the txn: copy once.
            arr = np.frombuffer(value, dtype=self._np_dtype, count=int(np.prod(self._shape)),
                                offset=HEADER_SIZE).reshape(self._shape).copy()
        return torch.from_numpy(arr), int(label)

    def __getitem__(self, index):
        return self.read(int(index))

    def __repr__(self):
        return "KilnDataset(%r: %d x %s %s)" % (
            self._dir, self._count, "x".join(map(str, self._shape)),
            _DTYPES[self._dtype_code][0])
