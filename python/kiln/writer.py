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
Field = collections.namedtuple("Field", ["dtype", "shape"])


def _field_tuples(fields):
    out = []
    for name, f in fields.items():
        dtype, shape = (f.dtype, f.shape) if isinstance(f, Field) else f
        out.append((str(name), str(dtype), tuple(shape)))
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
    """

    def __init__(self, path, fields, classes=None, label_field=None, mean=None, std=None,
                 recipe=None, dataset=None, shard_size=4 << 30, resume=False):
        self.path = os.fspath(path)
        source = {}
        if recipe is not None:
            source["recipe"] = recipe
        if dataset is not None:
            source["dataset"] = str(dataset)
        self._native = _kiln.Writer(self.path, _field_tuples(fields), label_field,
                                    list(classes or []), list(mean or []), list(std or []),
                                    json.dumps(source, sort_keys=True), int(shard_size),
                                    bool(resume))
        self.manifest = None

    @property
    def next_index(self):
        """The index the next appended sample gets (records written so far)."""
        return self._native.next_index

    def append(self, sample):
        """Writes `sample` (a dict: field name -> numpy array, CPU torch tensor or
        Python number) as the next record; returns its index."""
        return self._native.append(sample)

    def close(self):
        """Finishes the cache (writes its manifest); returns the manifest as a dict."""
        if self.manifest is None:
            self.manifest = json.loads(self._native.close())
        return self.manifest

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


def _load(dataset, index):
    """dataset[index] in a worker: (index, sample) or (index, the error's text)."""
    try:
        item = _as_sample(dataset[index])
        out = {}
        for k, v in item.items():  # CPU arrays travel back to the writer's process
            if hasattr(v, "detach") and hasattr(v, "cpu"):
                v = v.detach().cpu().numpy()
            out[k] = v
        return index, out, None
    except Exception as e:  # noqa: BLE001 - reported with the index, never written
        return index, None, "%s: %s" % (type(e).__name__, e)


_WORKER_DATASET = None


def _init_worker(dataset):
    global _WORKER_DATASET
    _WORKER_DATASET = dataset


def _load_in_worker(index):
    return _load(_WORKER_DATASET, index)


SKIPPED_NAME = "skipped.tsv"


def _read_skipped(path):
    skipped = {}
    try:
        with open(os.path.join(path, SKIPPED_NAME)) as f:
            next(f, None)  # header
            for line in f:
                index, _, reason = line.rstrip("\n").partition("\t")
                skipped[int(index)] = reason
    except FileNotFoundError:
        pass
    return skipped


def write_dataset(dataset, path, fields, workers=0, strict=False, progress=True, resume=True,
                  chunksize=16, **writer_args):
    """Writes a map-style dataset (anything with ``__len__`` and
    ``__getitem__`` returning a dict of fields, e.g. a torch ``Dataset``) into
    a kiln cache at `path`, in index order, and returns the cache's manifest.

    ``workers`` > 0 runs ``__getitem__`` in that many worker processes (0: in
    this process); the samples are written in index order, so the cache's
    bytes are the same for any number of workers. A sample whose
    ``__getitem__`` raises, or that does not fit `fields`, is skipped and
    reported with its index and reason (on stderr and in ``PATH/skipped.tsv``);
    with ``strict=True`` the first one raises instead. ``resume`` (default)
    continues an interrupted run after its committed records, with the same
    result as an uninterrupted one. Other keywords go to :class:`Writer`
    (``classes``, ``label_field``, ``mean``, ``std``, ``recipe``,
    ``shard_size``); ``dataset`` defaults to the dataset's class name.
    """
    import sys
    import time
    n = len(dataset)
    writer_args.setdefault("dataset", type(dataset).__name__)
    os.makedirs(path, exist_ok=True)
    skipped = _read_skipped(path) if resume else {}
    # The workers are forked before the writer opens the cache: a child
    # forked later would share the cache's lock (and LMDB's files), and a
    # worker still dying after a kill would keep the next run out.
    pool = None
    if workers > 0:
        import multiprocessing
        pool = multiprocessing.get_context("fork").Pool(
            workers, initializer=_init_worker, initargs=(dataset,))
    try:
        writer = Writer(path, fields, resume=resume, **writer_args)
    except BaseException:
        if pool is not None:
            pool.terminate()
            pool.join()
        raise
    # The dataset position after the committed records: records are the
    # indices not skipped, in order (a skip is logged before any later
    # record is written, so the log covers every committed record's past).
    start, records = 0, 0
    while records < writer.next_index and start < n:
        if start not in skipped:
            records += 1
        start += 1
    if records != writer.next_index:
        writer._native.abandon()
        if pool is not None:
            pool.terminate()
            pool.join()
        raise ValueError("%s holds %d records but the dataset has only %d samples left after "
                         "%d skipped: it was written from another dataset; remove it"
                         % (path, writer.next_index, records, len(skipped)))
    log_path = os.path.join(path, SKIPPED_NAME)
    log = open(log_path, "w")
    log.write("index\treason\n")
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

    t0, last = time.monotonic(), 0.0
    try:
        indices = range(start, n)
        if pool is not None:
            results = pool.imap(_load_in_worker, indices, chunksize=chunksize)
        else:
            results = (_load(dataset, i) for i in indices)
        for done, (index, sample, error) in enumerate(results, start + 1):
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
                print("\rkiln.write_dataset: %d/%d samples (%.0f/s)" % (done, n, rate),
                      end="\n" if done == n else "", file=sys.stderr, flush=True)
        manifest = writer.close()
    except BaseException:
        if not writer._native.closed:
            writer._native.abandon()  # committed records stay, for the next run
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        log.close()
    return manifest
