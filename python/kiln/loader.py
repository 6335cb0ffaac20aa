"""kiln.Loader: batches of a kiln cache filled by kiln's C++ loader, and the
load-time geometries it applies (kiln.RandomResizedCrop, kiln.ResizeCenterCrop).
Every size, box and normalization is computed in C++ (kiln::Loader); this
module allocates the ring of batch buffers and iterates."""
import collections
import os
import warnings
from copy import copy as _shallow_copy  # `copy` is a Loader argument

import numpy as np

from . import (Cache, CorruptionError, _NUMPY_DTYPES, _TORCH_DTYPES, _kiln, _norm_tensors,
               _verify_cache, normalize, torch)


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
               "random_crop", "flip", "crop_kind", "resize", "scale", "ratio")


class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` (with
    ``RandomHorizontalFlip`` when the Loader has ``flip=True``), applied by
    kiln.Loader's workers: per sample a box drawn as torchvision's
    ``get_params`` draws it, seeded by (seed, epoch, index), resized to
    size x size as PIL's ``img.crop(box).resize((size, size), BILINEAR)``.
    Pass it as ``kiln.Loader(..., crop=kiln.RandomResizedCrop(224))`` on a
    uint8 cache (images of one size, or each whole at its own size:
    ``kiln build --max-side`` / ``--shorter-side``)."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
        self.size = int(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))

    def __repr__(self):
        return "kiln.RandomResizedCrop(%d, scale=%r, ratio=%r)" % (self.size, self.scale,
                                                                  self.ratio)


class ResizeCenterCrop:
    """torchvision's evaluation transform ``Resize(resize)`` +
    ``CenterCrop(size)``, applied by kiln.Loader's workers on a uint8 cache.
    Exact (no resampling: the stored pixels, cut) on a cache built with
    ``kiln build --shorter-side RESIZE``; on other caches each image is
    resized with the PIL-exact resize first (``--max-side`` caches hold
    images already made smaller, so the result then differs from resizing
    the original file). ``resize=None``: no resize, the centre crop only."""

    def __init__(self, resize, size):
        self.resize = 0 if resize is None else int(resize)
        self.size = int(size)

    def __repr__(self):
        return "kiln.ResizeCenterCrop(%d, %d)" % (self.resize, self.size)


class Loader:
    """Batches of a kiln cache filled by kiln's C++ loader.

    Arguments: `path` (a directory or a kiln.Cache); `batch_size`;
    `shuffle` (a seeded permutation per epoch, the same on every machine;
    False: record order); `seed`; `rank`, `world_size` (rank r of W takes
    every W-th sample, as DistributedSampler; default: torchrun's RANK and
    WORLD_SIZE, read by kiln's C++ rule, else 0 and 1); `drop_last` (default
    False, as PyTorch's DataLoader: the short last batch is yielded; True
    drops it and, with several ranks, the tail that does not divide);
    `workers` (C++ threads); `crop`: an int (output H = W = crop, a window
    of records of one size: a seeded random window when `random_crop`,
    which defaults to `shuffle`, else the center as torchvision's
    CenterCrop), ``kiln.RandomResizedCrop(size, scale, ratio)`` (training)
    or ``kiln.ResizeCenterCrop(resize, size)`` (evaluation), both for uint8
    caches, whole images or not (see those classes); `flip` (seeded
    horizontal flip, p = 1/2); `max_resolution` (the largest size
    ``set_resolution`` may set later; the ring is sized for it); `epoch`,
    `start_batch` (where the first iteration begins); `copy`; `pin_memory` (the ring in page-locked memory, so that
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
    when memory is short; 0: off; or bytes); `dct_scaling` (a cache of JPEG
    records, ``kiln build --encode jpeg``: a crop box at least twice the
    output size is decoded at 1/2, 1/4 or 1/8 scale, faster and within
    docs/format.md's stated error; False: always at full scale, equal to
    Pillow's decode + torchvision's crop and resize).

    Iterating yields ``(x, y)``: x a tensor (batch, C, H, W) of the cache's
    dtype, y int64 labels (numpy arrays when torch is missing). With
    `dtype` (torch.float16 or torch.float32) and no `device`, a uint8
    cache's x comes out normalized with the manifest's mean and std,
    computed by the workers in the same pass as the crop; without `dtype`
    x keeps the cache's dtype. ``loader.boxes()`` says, for the batch last
    yielded, which box of each stored image it shows. Each full
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
    not hand it back, so ``x, y = next(iter(loader))`` stays valid - and so
    does ``next(iter(kiln.Loader(...)))`` of a loader dropped at once: a
    loader that goes away stops its workers without refilling the batch it
    handed out last. Keep a
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
                 device=None, dtype=None, channels_last=False, readahead="auto",
                 max_resolution=None, dct_scaling=True):
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
        o = _kiln.LoaderOptions()
        if isinstance(crop, RandomResizedCrop):
            o.crop_kind, o.crop, o.scale, o.ratio = "random_resized", crop.size, crop.scale, \
                crop.ratio
        elif isinstance(crop, ResizeCenterCrop):
            o.crop_kind, o.crop, o.resize = "resize_center", crop.size, crop.resize
        elif crop is not None:
            if int(crop) <= 0:
                raise ValueError("kiln.Loader: crop must be a positive size, "
                                 "kiln.RandomResizedCrop, kiln.ResizeCenterCrop or None, not %r"
                                 % (crop,))
            o.crop = int(crop)
        if random_crop is None:
            random_crop = bool(shuffle)
        if max_resolution is not None:
            o.max_crop = int(max_resolution)
        # dtype without a device: the workers normalize a uint8 cache in the
        # same pass; other conversions run after, on the CPU.
        if device is None and dtype is not None and torch is not None and \
                cache.dtype == "uint8" and dtype in (torch.float16, torch.float32):
            o.output_dtype = "float16" if dtype == torch.float16 else "float32"
        elif device is None and dtype is not None:
            device = "cpu"
        dtype = None if o.output_dtype else dtype  # the workers' job then
        self._device = self._resolve_device(device, dtype, channels_last)
        self._dtype, self._channels_last = dtype, bool(channels_last)
        o.batch_size = int(batch_size)
        o.workers = int(workers)
        o.shuffle = bool(shuffle)
        o.seed = int(seed)
        o.rank = int(env_rank if rank is None else rank)
        o.world_size = int(env_world if world_size is None else world_size)
        o.drop_last = bool(drop_last)
        o.random_crop = bool(random_crop) and o.crop_kind == "window" and o.crop > 0
        o.random_flip = bool(flip)
        o.verify_checksums = bool(verify)
        o.readahead_bytes = _readahead_bytes(readahead)
        o.dct_scaling = bool(dct_scaling)
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
                          "crop": o.crop, "random_crop": o.random_crop, "flip": o.random_flip,
                          "crop_kind": o.crop_kind, "resize": o.resize,
                          "scale": list(o.scale), "ratio": list(o.ratio)}
        self.rank, self.world_size, self.batch_size = o.rank, o.world_size, o.batch_size
        self._copy = bool(copy)

        out_dtype = _kiln.output_dtype(cache._native, o)  # kiln's geometry, checked there
        slot_bytes = _kiln.slot_bytes(cache._native, o)
        itemsize = _NUMPY_DTYPES[out_dtype].itemsize
        slot_elems = slot_bytes // itemsize
        # The ring: per slot a flat buffer for the largest resolution, viewed
        # at the current one (set_resolution), plus labels and boxes.
        if torch is not None:
            x = torch.empty((nslots, slot_elems), dtype=_TORCH_DTYPES[out_dtype], pin_memory=pin)
            y = torch.empty((nslots, o.batch_size), dtype=torch.int64, pin_memory=pin)
            boxes = torch.zeros((nslots, o.batch_size, 5), dtype=torch.int64)
            if not pin:
                x.zero_()  # fault the ring in now, not in the first epoch
            addr = [x[i].data_ptr() for i in range(nslots)]
            laddr = [y[i].data_ptr() for i in range(nslots)]
            baddr = [boxes[i].data_ptr() for i in range(nslots)]
        else:
            x = np.zeros((nslots, slot_elems), dtype=_NUMPY_DTYPES[out_dtype])
            y = np.zeros((nslots, o.batch_size), dtype=np.int64)
            boxes = np.zeros((nslots, o.batch_size, 5), dtype=np.int64)
            addr = [x[i].ctypes.data for i in range(nslots)]
            laddr = [y[i].ctypes.data for i in range(nslots)]
            baddr = [boxes[i].ctypes.data for i in range(nslots)]
        # The other fields (every one but the image and the label), each a
        # flat buffer per slot sized at the largest resolution, and its
        # lengths where a dim varies.
        o_max = _shallow_copy(o)  # every option, at the largest resolution
        o_max.crop = max(o.crop, o.max_crop)
        self._options = o
        self._extra = []  # (name, data ring, lengths ring or None)
        faddr = [[] for _ in range(nslots)]
        for f in _kiln.loader_fields(cache._native, o_max):
            elems = f["sample_bytes"] // _NUMPY_DTYPES[f["dtype"]].itemsize * o.batch_size
            nvar = len(f["variable"])
            if torch is not None:
                d = torch.zeros((nslots, elems), dtype=_TORCH_DTYPES[f["dtype"]])
                ln = torch.zeros((nslots, o.batch_size, nvar), dtype=torch.int64) if nvar else None
                for i in range(nslots):
                    faddr[i].append((d[i].data_ptr(), ln[i].data_ptr() if nvar else 0))
            else:
                d = np.zeros((nslots, elems), dtype=_NUMPY_DTYPES[f["dtype"]])
                ln = np.zeros((nslots, o.batch_size, nvar), dtype=np.int64) if nvar else None
                for i in range(nslots):
                    faddr[i].append((d[i].ctypes.data, ln[i].ctypes.data if nvar else 0))
            self._extra.append((f["name"], d, ln))
        self._ring = (x, y, boxes, self._extra)
        self._ys = [y[i] for i in range(nslots)]
        self._bs = [boxes[i] for i in range(nslots)]
        self._last_boxes = None
        self._native = _kiln.Loader(cache._native, o, addr, laddr, slot_bytes, self._ring, baddr,
                                    faddr if self._extra else [])
        #: Batches are (x, y) for a cache of an image and a label; a dict
        #: (field name -> tensor, plus NAME_lengths for a field whose size
        #: varies) when its records hold other fields too, or no label.
        self.yields_dict = bool(self._extra) or cache.label_field is None
        self._view_ring()
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
                why = ("this torch %s is built without CUDA" % torch.__version__
                       if torch.version.cuda is None else
                       "torch %s (CUDA %s) finds no GPU here" % (torch.__version__,
                                                                 torch.version.cuda))
                raise RuntimeError("no CUDA device: kiln.Loader(device=%r): %s "
                                   "(torch.cuda.is_available() is False); use device='cpu' or "
                                   "leave device out" % (str(device), why))
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError("kiln.Loader: dtype must be torch.float32, torch.float16 or "
                             "torch.bfloat16, not %r" % (dtype,))
        return device

    # ---- geometry --------------------------------------------------------

    def _view_ring(self):
        """Per slot, x of (batch, C, H, W) at the current resolution, and the
        other fields' shapes there."""
        x = self._ring[0]
        shape = (self.batch_size,) + tuple(self._native.sample_shape)
        n = int(np.prod(shape, dtype=np.int64))
        self._xs = [x[i][:n].reshape(shape) for i in range(x.shape[0])]
        self._field_shapes = [(tuple(f["shape"]), f["variable"])
                              for f in _kiln.loader_fields(self.cache._native, self._options)]

    def _fields(self, slot, size):
        """The other fields of the batch in `slot` (its first `size` samples):
        each padded only to the batch's longest along its varying dims."""
        out = {}
        for (name, data, lengths), (shape, variable) in zip(self._extra, self._field_shapes):
            n = int(np.prod(shape, dtype=np.int64))
            v = data[slot][:n * self.batch_size].reshape((self.batch_size,) + shape)[:size]
            if lengths is not None:
                ln = lengths[slot][:size]
                for k, dim in enumerate(variable):
                    longest = int(ln[:, k].max()) if size else 0
                    index = [slice(None)] * (1 + len(shape))
                    index[1 + dim] = slice(0, longest)
                    v = v[tuple(index)]
                out[name + "_lengths"] = ln[:, 0] if len(variable) == 1 else ln
            out[name] = v
        return out

    def set_resolution(self, size):
        """The output size (H = W) from the next iteration on - a resolution
        schedule, as FFCV's progressive resizing: at most `max_resolution`
        (the ring is sized for it once). Call it between epochs; the batch
        held now goes back to the workers."""
        self._native.set_resolution(int(size))
        self._settings["crop"] = int(size)
        self._options.crop = int(size)
        self._view_ring()
        self._generation += 1

    def boxes(self):
        """For the batch last yielded: an int64 tensor (batch, 5) of each
        sample's box in its stored image - top, left, height, width - and 1
        where it was flipped (RandomResizedCrop: the box drawn; a window
        crop: the window; Resize + CenterCrop: the crop mapped back onto the
        stored image). To move box targets, or to check the crop. Valid as
        long as the batch is."""
        if self._last_boxes is None:
            raise RuntimeError("kiln.Loader.boxes(): no batch has been yielded yet")
        return self._last_boxes

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

    def epoch_order(self, epoch, skip=0):
        """This rank's sample indices of `epoch`, in the order they are loaded
        (with `skip`: of the rest of the epoch after its first `skip`
        samples, as after an elastic resume)."""
        return self._native.epoch_order(int(epoch), int(skip))

    # ---- position --------------------------------------------------------

    def set_epoch(self, epoch):
        """The next iteration runs epoch `epoch` from its first batch."""
        self._native.set_position(int(epoch), 0)
        self._generation += 1  # a running iteration ends

    def state_dict(self):
        """The position - the epoch, the next batch to yield (a batch already
        yielded counts as consumed), the samples skipped at the epoch's start
        and `consumed`, the samples of the epoch the whole job (every rank)
        has consumed - with the settings that fix the order."""
        d = dict(self._settings)
        epoch, batch, skip, consumed = self._native.position()
        d.update({"epoch": epoch, "batch": batch, "skip": skip, "consumed": consumed})
        return d

    def load_state_dict(self, state):
        """Continue where `state` (from state_dict) left off, at the next
        iteration. A state saved under another world size or batch size
        continues the epoch elastically: the samples the whole job has not
        yet consumed are partitioned over this loader's ranks, so that every
        one is seen once (every rank must load the same state). Raises
        ValueError if it came from a loader with other settings that decide
        the samples (cache size, seed, shuffle, crop, ...)."""
        elastic = ("world_size", "batch_size")
        diff = ["%s: %r in the state, %r here" % (k, state.get(k), self._settings[k])
                for k in _ORDER_KEYS if state.get(k) != self._settings[k] and k not in elastic]
        if diff:
            raise ValueError("kiln.Loader.load_state_dict: the state comes from a loader with "
                             "other settings, its batches would differ: " + "; ".join(diff))
        same = all(state.get(k) == self._settings[k] for k in elastic)
        if same:
            self._native.set_position(int(state["epoch"]), int(state["batch"]),
                                      int(state.get("skip", 0)))
        elif "consumed" not in state:
            raise ValueError("kiln.Loader.load_state_dict: the state was saved under another "
                             "world size or batch size (%s) by a kiln without elastic resume "
                             "(no 'consumed' in it); resume with the same settings"
                             % ", ".join("%s %r -> %r" % (k, state.get(k), self._settings[k])
                                         for k in elastic))
        else:
            consumed = int(state["consumed"])
            if consumed >= self.cache.count:  # the epoch was finished
                self._native.set_position(int(state["epoch"]) + 1, 0, 0)
            else:
                self._native.set_position(int(state["epoch"]), 0, consumed)
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
        x, y, boxes = self._xs[slot], self._ys[slot], self._bs[slot]
        if size != self.batch_size:
            x, y, boxes = x[:size], y[:size], boxes[:size]
        return x, y, boxes, (self._fields(slot, size) if self._extra else None)

    def _out(self, x, y, extra):
        """What the iterator yields: (x, y), or the dict (see yields_dict)."""
        if not self.yields_dict:
            return x, y
        d = {self.cache.image_field: x}
        if self.cache.label_field is not None:
            d[self.cache.label_field] = y
        d.update(extra or {})
        return d

    def _run(self, generation):
        native = self._native
        native.start()
        while True:
            self._check(generation)
            b = native.next()
            if b is None:
                break
            x, y, boxes, extra = self._batch(b)
            if self._copy:
                copy = (lambda t: t.clone()) if torch is not None else (lambda t: t.copy())
                x, y, boxes = copy(x), copy(y), copy(boxes)
                extra = {k: copy(v) for k, v in extra.items()} if extra else extra
                native.hand_back()  # the workers may refill it now
            self._last_boxes = boxes
            native.yielded(b[2], b[3])
            yield self._out(x, y, extra)
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
        x, y, boxes, extra = self._batch(b)
        boxes = boxes.clone()  # the slot goes back before this batch is yielded
        extra = extra or {}
        if dev.type == "cuda":
            side = self._side_stream
            with torch.cuda.stream(side):
                dx = x.to(dev, non_blocking=True)
                dy = y.to(dev, non_blocking=True)
                # The other fields: their views are not pinned memory
                # laid out contiguously, so they are copied synchronously
                # with respect to the host (small next to the image).
                dextra = {k: v.to(dev) for k, v in extra.items()}
                read = torch.cuda.Event()
                read.record(side)
                dx = self._convert(dx)
                ready = torch.cuda.Event()
                ready.record(side)
            native.hand_back(read)
        else:
            dx, dy = self._convert(x.to(dev, copy=True)), y.to(dev, copy=True)
            dextra = {k: v.to(dev, copy=True) for k, v in extra.items()}
            ready = None
            native.hand_back()
        ahead.append((dx, dy, ready, b[2], b[3], boxes, dextra))
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
            dx, dy, ready, epoch, index, boxes, dextra = ahead.popleft()
            self._last_boxes = boxes
            self._launch(ahead)  # the next copy runs while this batch is used
            if ready is not None:
                current = torch.cuda.current_stream(dev)
                current.wait_event(ready)
                for t in [dx, dy] + list(dextra.values()):
                    t.record_stream(current)
            native.yielded(epoch, index)
            yield self._out(dx, dy, dextra)
        native.epoch_done()

    def __reduce__(self):
        raise TypeError("a kiln.Loader cannot be pickled (it owns threads and a ring of "
                        "buffers): make one in each process, or pass a kiln.Cache instead")

    def __repr__(self):
        return "kiln.Loader(%r, batch_size=%d, rank %d of %d, %d batches per epoch)" % (
            self.cache.path, self.batch_size, self.rank, self.world_size, len(self))
