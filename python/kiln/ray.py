"""kiln.ray: build a kiln cache with Ray tasks, one part each, joined by
kiln merge into the cache one process would have written.

::

    import ray, kiln.ray
    ray.init()                                   # or ray.init(address="auto") on a cluster
    kiln.ray.build("/data/imagenet/train", "/data/cache/train",
                   "--max-side", "256", "--encode", "jpeg", parts=64)
    kiln.ray.write_dataset(my_dataset, "/data/cache/mine", fields, parts=64)

* :func:`build` runs ``kiln build SRC OUT ARGS --num-parts N --part i`` in
  task i (the kiln executable on each node) and then ``kiln merge OUT``:
  the records, classes and recipe are those of ``kiln build SRC OUT ARGS``
  on one machine, record for record.
* :func:`write_dataset` writes the samples ``[n*i/N, n*(i+1)/N)`` of a
  map-style dataset (or the i-th contiguous block of a ``ray.data.Dataset``)
  with ``kiln.write_dataset`` in task i, then joins the parts: the records
  and manifest of ``kiln.write_dataset`` of the same samples in one process
  (only the shard files are cut otherwise).

Every task writes to OUT, so on a cluster OUT (and SRC) must be one shared
file system that all nodes see at the same path, and kiln must be installed
on every node (``pip install ./python``, and the ``kiln`` command for
:func:`build`). A part that fails stops the build with its error; running
the same call again resumes every unfinished part where it stopped.
"""
import json
import os
import shutil
import subprocess

from . import _kiln
from .writer import SKIPPED_HEADER, SKIPPED_NAME, write_dataset as _write_dataset


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("kiln.ray needs Ray: pip install ray") from None
    if not ray.is_initialized():
        ray.init()
    return ray


def _parts(parts, n, ray):
    """How many parts: `parts`, else the cluster's CPUs; at most n (each part
    gets a sample), at least 1."""
    if parts is None:
        parts = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(int(parts), max(int(n), 1)))


def _manifest_path(path):
    return os.path.join(path, _kiln.MANIFEST_NAME)


def _kiln_command(kiln):
    found = kiln or os.environ.get("KILN_BIN") or shutil.which("kiln")
    if not found:
        raise FileNotFoundError("kiln.ray.build: no kiln command (give kiln=PATH, set KILN_BIN, "
                                "or put kiln on PATH on every node)")
    return found


def _all(ray, pending, what):
    """The tasks' results once every one has ended (a failed part leaves
    the others to finish, so a run again resumes only what is left); the
    first failure is raised, naming its part."""
    ray.wait(pending, num_returns=len(pending))
    results = []
    for i, ref in enumerate(pending):
        try:
            results.append(ray.get(ref))
        except Exception as e:
            cause = getattr(e, "cause", None) or e
            raise RuntimeError("%s: part %d of %d failed: %s: %s"
                               % (what, i, len(pending), type(cause).__name__, cause)) from e
    return results


def _build_part(command):
    """A task: one kiln build part. Returns (exit code, its output)."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def build(src, out, *args, parts=None, kiln=None, num_cpus=1):
    """``kiln build SRC OUT ARGS`` as `parts` Ray tasks (default: the
    cluster's CPUs), each ``--num-parts N --part i`` with `num_cpus` CPUs
    (``--threads`` follows it unless ARGS set it), then ``kiln merge OUT``.
    `kiln` is the kiln command on the nodes (default: ``KILN_BIN``, else
    ``kiln`` on PATH). Returns kiln merge's summary (a dict: ``records``,
    ``shards``, ``rewritten_records``, ``duplicate_groups``, ...). A part
    that fails raises RuntimeError with its output; run again to resume."""
    ray = _ray()
    kiln = _kiln_command(kiln)
    src, out = os.fspath(src), os.fspath(out)
    args = [str(a) for a in args]
    if not any(a == "--threads" or a.startswith("--threads=") for a in args):
        args += ["--threads", str(int(num_cpus))]
    n = _parts(parts, 1 << 62, ray)
    task = ray.remote(num_cpus=num_cpus)(_build_part)
    pending = [task.remote([kiln, "build", src, out] + args +
                           ["--num-parts", str(n), "--part", str(i), "--progress", "none"])
               for i in range(n)]
    for i, (code, output) in enumerate(_all(ray, pending, "kiln.ray.build")):
        if code != 0:
            raise RuntimeError("kiln.ray.build: part %d of %d failed (exit code %d):\n%s"
                               % (i, n, code, output))
    return _kiln.merge_parts(out, [], False)


def _write_part(dataset, path, fields, part, options, writer_args):
    """A task: kiln.write_dataset of one part (a ray.data block is read as
    an iterable of its rows)."""
    if not os.path.exists(_manifest_path(path)):  # else a run before finished it
        if hasattr(dataset, "iter_rows"):
            dataset = dataset.iter_rows()
        _write_dataset(dataset, path, fields, _part=part, progress=False, **options,
                       **writer_args)
    with open(os.path.join(path, SKIPPED_NAME)) as f:
        return f.read()


def write_dataset(dataset, path, fields, /, parts=None, strict=False, resume=True, num_cpus=1,
                  **writer_args):
    """``kiln.write_dataset(dataset, path, fields, ...)`` as `parts` Ray
    tasks (default: the cluster's CPUs) of `num_cpus` CPUs each, then kiln
    merge; returns the manifest (a dict). `dataset` is map-style (a torch
    ``Dataset``, a Hugging Face ``datasets.Dataset``, a list of dicts; sent
    to the tasks through Ray's object store, so it must pickle) or a
    ``ray.data.Dataset`` of rows that are dicts of fields (``ds.map`` them
    into the declared fields first), split into contiguous blocks in its
    order. The records and manifest equal those of one
    ``kiln.write_dataset`` of the same samples in the same order (for a
    ``ray.data.Dataset`` give ``dataset=`` a name; it defaults to the class
    name). Skipped samples are logged in ``PATH/skipped.tsv`` by their
    index; `strict` raises at the first. Other keywords go to
    :class:`kiln.Writer`. An interrupted run resumes its parts."""
    ray = _ray()
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(_manifest_path(path)):
        raise ValueError("%s already holds a finished cache; write into a new directory" % path)
    ray_data = hasattr(dataset, "split_at_indices") and hasattr(dataset, "iter_rows")
    if ray_data:
        total = dataset.count()
        writer_args.setdefault("dataset", type(dataset).__name__)
    else:
        total = len(dataset)
    n = _parts(parts, total, ray)
    bounds = [total * i // n for i in range(n + 1)]
    blocks = dataset.split_at_indices(bounds[1:-1]) if ray_data else None
    os.makedirs(path, exist_ok=True)
    shared = None if ray_data else ray.put(dataset)
    task = ray.remote(num_cpus=num_cpus)(_write_part)
    dirs = [os.path.join(path, _kiln.part_dir_name(i, n)) for i in range(n)]
    options = {"strict": strict, "resume": resume}
    pending = [task.remote(blocks[i] if ray_data else shared, dirs[i], fields,
                           (i, n, bounds[i], bounds[i + 1]), options, writer_args)
               for i in range(n)]
    logs = _all(ray, pending, "kiln.ray.write_dataset")
    # The parts' skip logs (global indices, in order) become the cache's.
    lines = [SKIPPED_HEADER]
    for text in logs:
        lines += text.splitlines(keepends=True)[1:]
    tmp = os.path.join(path, SKIPPED_NAME + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(lines)
    _kiln.merge_parts(path, dirs, False)
    os.replace(tmp, os.path.join(path, SKIPPED_NAME))
    with open(_manifest_path(path)) as f:
        return json.load(f)
