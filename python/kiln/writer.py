"""kiln.Writer: write a kiln cache (format 2) from Python, sample by sample.

::

    import kiln, numpy as np
    fields = {"image": kiln.Field("uint8", (3, None, None)),   # None: varies per record
              "boxes": kiln.Field("float32", (None, 4)),
              "label": kiln.Field("int64", ())}                # () : a scalar
    with kiln.Writer("cache/train", fields, classes=["cat", "dog"]) as w:
        for image, boxes, label in my_samples():
            w.append({"image": image, "boxes": boxes, "label": label})

Every check of a sample against the fields (missing or undeclared fields,
dtype, number of dims, fixed sizes) is made by kiln's C++ writer, which
raises ValueError naming the sample's index and the field; nothing is
written for a sample that does not fit. The cache is complete once
``close()`` (or the end of the ``with`` block) has written its manifest; a
writer dropped before, or an exception inside the block, leaves what was
committed for ``resume=True``.
"""
import collections
import json
import os

from . import _kiln

#: A field's declaration: its dtype name ("uint8", "float16", "float32",
#: "int32", "int64") and its shape, a tuple whose entries are sizes or None
#: for a size that varies from record to record (``()`` for a scalar).
#: ``codec="jpeg"``: a uint8 (C, H, W) image (C 1 or 3) stored as a JPEG and
#: decoded by the loader's workers; each sample gives the JPEG's bytes
#: (stored as they are, once checked to decode) or a uint8 (C, H, W) array
#: (encoded at quality 90).
Field = collections.namedtuple("Field", ["dtype", "shape", "codec"], defaults=(None,))


def _field_tuples(fields):
    out = []
    for name, f in fields.items():
        if isinstance(f, Field):
            dtype, shape, codec = f
        else:
            dtype, shape, codec = (tuple(f) + (None,))[:3]
        out.append((str(name), str(dtype), tuple(shape), codec))
    return out


class Writer:
    """A new kiln cache at `path`, written record by record.

    ``fields`` maps each field's name to a :class:`Field`, in the order the
    records store them. The field named ``"image"`` (else the first) is what
    ``kiln.Loader`` batches; ``label_field`` names the field of class indices
    (an int64 or int32 scalar; default: ``"label"`` when there is one,
    ``""`` for none), whose values must lie within ``classes`` when given.
    ``mean``/``std`` (per channel, in [0, 1] pixel units) are recorded for a
    uint8 image field, as loaders normalize with them. ``recipe`` (a
    JSON-able dict) and ``dataset`` (a name) say where the data came from;
    the manifest keeps them under ``preprocessing``. ``shard_size`` is the
    record bytes per shard file. ``resume=True`` continues after the
    records already committed in `path` (``next_index`` says where).

    ``part=(index, count, first)`` writes part `index` of `count` of a cache
    written in parts, whose records are the global indices ``first``..
    (``kiln.ray.write_dataset`` writes each part in a task of its own and
    joins them with kiln merge); readers refuse a part until it is merged.

    ``mode="append"`` adds records to the finished cache at `path` instead:
    ``fields`` (and ``label_field``) must be the cache's, the new records go
    into new shard files after the old ones (no old shard is rewritten),
    the cache's classes are kept (``classes`` may add names at the end) and
    ``mean``/``std``, if given, must be the cache's. Until ``close()`` the
    old manifest stays in place, so readers see the old records; ``close()``
    publishes the new one atomically, with an entry in its ``appends``
    (``dataset`` is its "from"). An append that was interrupted is resumed:
    ``next_index`` says where (``append_base`` is the count before it).
    """

    def __init__(self, path, fields, classes=None, label_field=None, mean=None, std=None,
                 recipe=None, dataset=None, shard_size=4 << 30, resume=False, mode="w",
                 part=None):
        if mode not in ("w", "append"):
            raise ValueError("kiln.Writer: mode is 'w' (a new cache) or 'append', not %r" % (mode,))
        self.path = os.fspath(path)
        source = {}
        if recipe is not None:
            source["recipe"] = recipe
        if dataset is not None:
            source["dataset"] = str(dataset)
        self._native = _kiln.Writer(self.path, _field_tuples(fields), label_field,
                                    list(classes or []), list(mean or []), list(std or []),
                                    json.dumps(source, sort_keys=True), int(shard_size),
                                    bool(resume), mode == "append",
                                    str(dataset) if dataset is not None else "kiln.Writer",
                                    [int(v) for v in part] if part is not None else [])
        self.manifest = None

    @property
    def next_index(self):
        """The index the next appended sample gets (records written so far)."""
        return self._native.next_index

    @property
    def append_base(self):
        """Appending: the cache's record count before this append (else 0)."""
        return self._native.append_base

    def append(self, sample):
        """Writes `sample` (a dict: field name -> numpy array, CPU torch tensor or
        Python number) as the next record; returns its index."""
        return self._native.append(sample)

    def close(self):
        """Finishes the cache (writes its manifest, then ``duplicates.tsv``);
        returns the manifest as a dict."""
        if self.manifest is None:
            self.manifest = json.loads(self._native.close())
        return self.manifest

    @property
    def duplicates(self):
        """After ``close()``: what ``path/duplicates.tsv`` reports (records
        equal in every field but the label, docs/format.md), as a dict of
        ``groups``, ``repeats`` and ``label_conflicts``; after an append, over
        the old and the new records. None before ``close()`` and for a part
        (its parts' merge writes the report)."""
        return self._native.duplicates

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._native.abandon()  # committed records stay, for resume=True
        return False


def _as_sample(item):
    """A dataset item as a dict of fields (dicts pass; anything else is refused)."""
    if isinstance(item, dict):
        return item
    raise TypeError("the dataset returned a %s, not a dict of fields" % type(item).__name__)


def _load(dataset, index, convert=None, item=None):
    """dataset[index] (or the iterated `item`) in a worker: (index, sample,
    None) or (index, None, the error's text)."""
    try:
        item = _as_sample(dataset[index] if item is None else item)
        if convert is not None:
            item = convert(item)
        out = {}
        for k, v in item.items():  # CPU arrays travel back to the writer's process
            if hasattr(v, "detach") and hasattr(v, "cpu"):
                v = v.detach().cpu().numpy()
            out[k] = v
        return index, out, None
    except Exception as e:  # noqa: BLE001 - reported with the index, never written
        return index, None, "%s: %s" % (type(e).__name__, e)


class _Slots:
    """How samples travel from the worker processes to the writer: shared
    memory (an anonymous shared mapping made before the fork), one slot of
    `capacity` bytes per index modulo `count`, so a sample's arrays are copied
    once by the worker and read in place by the writer, instead of pickled
    through a pipe (four copies and fresh pages per sample).

    Slot ``i % count`` may take index ``i`` once the writer has finished with
    index ``i - count``: the writer consumes in index order and each worker
    produces its indices in order, so the index the writer waits for never
    waits for a slot. A sample whose arrays do not fit travels pickled."""

    ALIGN = 64

    def __init__(self, ctx, count, capacity):
        import mmap
        self.count, self.capacity = count, capacity
        self.memory = mmap.mmap(-1, count * capacity)
        self.owner = ctx.RawArray("q", count)  # the index each slot may take next
        self.cond = ctx.Condition()

    def begin(self, start):
        """Before the workers start: slot s takes first the smallest index
        from `start` that falls on it."""
        for s in range(self.count):
            self.owner[s] = start + (s - start) % self.count

    def put(self, index, sample, parent):
        """In a worker: (arrays, values) - each array's (dtype, shape, offset)
        in the slot, the other values as they are - or None where the arrays
        do not fit. Returns None too if the writer process (`parent`) is gone."""
        import numpy as np
        arrays, values, at = [], {}, 0
        for name, v in sample.items():
            if isinstance(v, np.ndarray) and not v.dtype.hasobject:
                v = np.asarray(v, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
                arrays.append((name, v, at))
                at += -(-v.nbytes // self.ALIGN) * self.ALIGN
            else:
                values[name] = v
        if at > self.capacity:
            return None
        s = index % self.count
        with self.cond:
            while self.owner[s] != index:
                if os.getppid() != parent:
                    return None
                self.cond.wait(1.0)
        base = s * self.capacity
        view = memoryview(self.memory)
        layout = {}
        for name, v, off in arrays:
            view[base + off:base + off + v.nbytes] = v.reshape(-1).view(np.uint8)
            layout[name] = (v.dtype.str, v.shape, base + off)
        return layout, values

    def get(self, layout):
        """In the writer: the sample, its arrays viewing the slot."""
        import numpy as np
        arrays, values = layout
        out = dict(values)
        for name, (dtype, shape, off) in arrays.items():
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(self.memory, dtype=dtype, count=count,
                                      offset=off).reshape(shape)
        return out

    def release(self, index):
        """In the writer, done with `index`: its slot may take index + count."""
        with self.cond:
            self.owner[index % self.count] = index + self.count
            self.cond.notify_all()


def _worker(dataset, convert, slots, conn, offset, step, end, parent):
    """A worker process: from the start index it receives on `conn`, the
    indices start + offset, + step, ... below `end` into `slots`, each
    announced on `conn`, in order, as (index, layout, pickled sample, error)
    (a send is written before it returns, so nothing sent is lost if the
    worker is killed). Ends when the writer process is gone."""
    while not conn.poll(1.0):
        if os.getppid() != parent:
            return
    start = conn.recv()
    for index in range(start + offset, end, step):
        index, sample, error = _load(dataset, index, convert)
        layout = None
        if sample is not None:
            try:
                layout = slots.put(index, sample, parent)
            except Exception:  # noqa: BLE001 - the sample goes pickled instead
                layout = None
        if os.getppid() != parent:
            return
        conn.send((index, layout, sample if layout is None else None, error))


def _worker_results(slots, workers, start, n):
    """The writer's side of the workers ((process, connection) each):
    (index, sample, error) in index order, each read from the worker that
    owns it; the sample's slot is handed back when the next one is asked
    for. A worker that dies (killed, out of memory) stops the run with an
    error naming the sample it owed."""
    from multiprocessing.connection import wait
    held = None
    for index in range(start, n):
        if held is not None:
            slots.release(held)
            held = None
        proc, conn = workers[(index - start) % len(workers)]
        while not wait([conn, proc.sentinel], 1.0):
            pass
        try:  # a dead worker's pipe reads what it sent, then EOF
            if not conn.poll():
                raise EOFError
            got, layout, sample, error = conn.recv()
        except EOFError:
            proc.join(1.0)
            raise RuntimeError(
                "kiln.write_dataset: the worker process for sample %d ended (exit code %s) "
                "without it; the records before it are kept: run again to resume"
                % (index, proc.exitcode)) from None
        if got != index:
            raise RuntimeError("kiln.write_dataset: worker sent sample %d for %d" % (got, index))
        if layout is not None:
            sample, held = slots.get(layout), index
        else:
            slots.release(index)  # not in its slot: the slot's next index may come
        yield index, sample, error
    if held is not None:
        slots.release(held)


SKIPPED_NAME = "skipped.tsv"
SKIPPED_HEADER = "index\treason\n"  # then one "INDEX\tREASON" line per skipped sample


def _skipped_name(base):
    """The skip log of a first write (base 0) or of the append after record base."""
    return SKIPPED_NAME if base == 0 else "skipped-append-%d.tsv" % base


def _read_skipped(path, name=SKIPPED_NAME):
    skipped = {}
    try:
        with open(os.path.join(path, name)) as f:
            next(f, None)  # header
            for line in f:
                index, _, reason = line.rstrip("\n").partition("\t")
                skipped[int(index)] = reason
    except FileNotFoundError:
        pass
    return skipped


def _iterated(dataset, start, convert, origin=0):
    """An iterable's items, the first at position `origin`, from position
    `start` on (those before are consumed and dropped: they are the records
    already written), as (position, sample, error); then a final (position,
    None, None) that says where the items ended."""
    position = origin - 1
    for position, item in enumerate(dataset, origin):
        if position >= start:
            yield _load(None, position, convert, item)
    yield position + 1, None, None


def write_dataset(dataset, path, fields, /, workers=0, strict=False, progress=True, resume=True,
                  slot_bytes=16 << 20, append=False, _part=None, **writer_args):
    """Writes a dataset into a kiln cache at `path`, in its order, and returns
    the cache's manifest.

    The dataset is map-style (``__len__`` and ``__getitem__`` returning a
    dict of fields: a torch ``Dataset``, a Hugging Face ``datasets.Dataset``,
    a list of dicts) or an iterable (a torch ``IterableDataset``, a
    generator, anything without ``__len__``; read in this process, in the
    order it yields, so ``workers`` does not apply). PIL images in a sample
    become the declared fields' uint8 (C, H, W) arrays (``kiln.sources``);
    a ``datasets.Dataset`` gives its ``ClassLabel`` names as ``classes``
    and, for a JPEG field, its JPEG files' own bytes.

    ``workers`` > 0 runs a map-style ``__getitem__`` (and the PIL decode) in
    that many worker processes (0: in this process); the samples are written
    in index order, so the cache's bytes are the same for any number of
    workers. Their arrays reach the writer through shared memory,
    ``slot_bytes`` per sample in flight (4 per worker; a larger sample
    travels pickled). A sample whose ``__getitem__`` raises, or that does
    not fit `fields`, is skipped and reported with its index and reason (on
    stderr and in ``PATH/skipped.tsv``); with ``strict=True`` the first one
    raises instead. ``resume`` (default) continues an interrupted run after
    its committed records, with the same result as an uninterrupted one.

    ``append=True`` adds the dataset's samples after the records of the
    finished cache at `path` (``kiln.Writer(mode="append")``: same fields,
    new shards, the old manifest in place until the new one is published).
    An interrupted append resumes like a first write; its skips are logged
    in ``PATH/skipped-append-<count before>.tsv``. An append that finished
    is finished: running it again appends the samples again.

    Other keywords go to :class:`Writer` (``classes``, ``label_field``,
    ``mean``, ``std``, ``recipe``, ``shard_size``); ``dataset`` defaults to
    the dataset's class name (the first three arguments are positional, so
    ``dataset=`` is the name).

    ``_part=(index, count, lo, hi)`` (kiln.ray): writes the samples lo..hi-1
    (an iterable: its items are those) as part `index` of `count` at `path`.
    """
    import sys
    import time
    from . import sources
    dataset = sources.adapt(dataset, fields, writer_args)
    convert = sources.Converter(fields)
    iterable = sources.is_iterable(dataset)
    # The positions lo..n-1 are written (n None: an iterable's end).
    lo, n = 0, None if iterable else len(dataset)
    if _part is not None:
        lo, n = int(_part[2]), None if iterable else int(_part[3])
        writer_args["part"] = (int(_part[0]), int(_part[1]), lo)
    if iterable:
        workers = 0
    writer_args.setdefault("dataset", type(dataset).__name__)
    if not append:
        os.makedirs(path, exist_ok=True)
    # The workers are forked before the writer opens the cache: a child
    # forked later would share the cache's lock (and LMDB's files), and a
    # worker still dying after a kill would keep the next run out. They wait
    # for the index to start from, known once the cache is open.
    procs, slots = [], None
    if workers > 0:
        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        slots = _Slots(ctx, 4 * workers, int(slot_bytes))
        for w in range(workers):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, daemon=True,
                            args=(dataset, convert, slots, theirs, w, workers, n, os.getpid()))
            p.start()
            theirs.close()
            procs.append((p, mine))

    def stop_workers():
        for p, conn in procs:
            p.terminate()
        for p, conn in procs:
            p.join()
            conn.close()

    try:
        writer = Writer(path, fields, resume=resume, mode="append" if append else "w",
                        **writer_args)
    except BaseException:
        stop_workers()
        raise
    base = writer.append_base if append else lo
    log_name = _skipped_name(writer.append_base)
    skipped = _read_skipped(path, log_name) if resume else {}
    # The dataset position after the committed records: records are the
    # indices not skipped, in order (a skip is logged before any later
    # record is written, so the log covers every committed record's past).
    written = writer.next_index - base
    start, records = lo, 0
    while records < written and (n is None or start < n):
        if start not in skipped:
            records += 1
        start += 1
    if records != written:
        writer._native.abandon()
        stop_workers()
        raise ValueError("%s holds %d records but the dataset has only %d samples left after "
                         "%d skipped: it was written from another dataset; remove it"
                         % (path, written, records, len(skipped)))
    log_path = os.path.join(path, log_name)
    log = open(log_path, "w")
    log.write(SKIPPED_HEADER)
    for index in sorted(i for i in skipped if i < start):
        log.write("%d\t%s\n" % (index, skipped[index]))
    log.flush()

    def skip(index, reason):
        if strict:
            raise ValueError("sample %d: %s" % (index, reason))
        print("kiln.write_dataset: skipping sample %d: %s" % (index, reason), file=sys.stderr)
        log.write("%d\t%s\n" % (index, reason.replace("\n", " ").replace("\t", " ")))
        log.flush()
        os.fsync(log.fileno())

    t0, last, done = time.monotonic(), 0.0, start
    try:
        if procs:
            slots.begin(start)
            for _, conn in procs:
                conn.send(start)
            results = _worker_results(slots, procs, start, n)
        elif iterable:
            results = _iterated(dataset, start, convert, lo)
        else:
            results = (_load(dataset, i, convert) for i in range(start, n))
        for index, sample, error in results:
            if iterable and sample is None and error is None:
                if index < start:  # the iterable ended before the written records
                    raise ValueError("%s holds %d records but the iterable yielded only %d "
                                     "samples: it was written from another dataset; remove it"
                                     % (path, written, index))
                break
            done = index + 1
            if error is not None:
                skip(index, error)
            else:
                try:
                    writer.append(sample)
                except ValueError as e:
                    skip(index, str(e))
            now = time.monotonic()
            if progress and (now - last > 1.0 or done == n):
                last = now
                rate = (done - start) / max(now - t0, 1e-9)
                total = "/%d" % n if n is not None else ""
                print("\rkiln.write_dataset: %d%s samples (%.0f/s)" % (done, total, rate),
                      end="\n" if done == n else "", file=sys.stderr, flush=True)
        if progress and n is None and done > start:
            print(file=sys.stderr)
        manifest = writer.close()
    except BaseException:
        if not writer._native.closed:
            writer._native.abandon()  # committed records stay, for the next run
        raise
    finally:
        stop_workers()
        log.close()
    return manifest
