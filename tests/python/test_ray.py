"""kiln.ray on a local Ray cluster (ray.init(num_cpus=2)): a build in Ray
tasks equals kiln build, a write_dataset in Ray tasks equals one in a single
process, and an interrupted one resumes. Run as test_ray.py SYNTH
DUMP_RECORDS DUMP_BATCHES CHECK (module_common.py); one CTest test per
check. Needs ray (the CUDA build's venv: tools/torch-requirements.txt)."""
import json
import os
import subprocess
import sys

from module_common import expect_raises, run

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
import ray  # noqa: E402

import kiln  # noqa: E402
import kiln.ray  # noqa: E402
import numpy as np  # noqa: E402

from writer_samples import FIELDS, Samples  # noqa: E402

KILN_BIN = os.environ.get("KILN_BIN")
FASHION = os.path.join(os.path.dirname(os.environ.get("KILN_SAMPLE_PHOTOS", "")), "fashion",
                       "train")


def records(path):
    c = kiln.Cache(path)
    return [{k: (v.dtype.str, v.shape, v.tobytes()) for k, v in c.read(i, verify=True).items()}
            for i in range(len(c))]


def manifest(path):
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    m.pop("shards")  # the files are cut at other records
    return m


def start_ray():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=256 << 20)


def check_write_dataset_equals_local(tmp):
    """Three parts in Ray tasks (a skipped sample in the middle one) merge
    into the records and manifest of one write_dataset; the skip log names
    the sample by its index."""
    start_ray()
    data = Samples(70, bad=30)
    local, spread = os.path.join(tmp, "local"), os.path.join(tmp, "ray")
    kiln.write_dataset(data, local, FIELDS, classes=["a", "b", "c", "d", "e"], progress=False)
    m = kiln.ray.write_dataset(data, spread, FIELDS, parts=3, classes=["a", "b", "c", "d", "e"])
    assert m["count"] == 69, m["count"]
    assert records(spread) == records(local)
    assert manifest(spread) == manifest(local)
    assert not [d for d in os.listdir(spread) if d.startswith("part-")]
    with open(os.path.join(spread, "skipped.tsv")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\treason" and lines[1].startswith("30\t"), lines
    assert kiln.verify(spread)["clean"]
    expect_raises(ValueError, lambda: kiln.ray.write_dataset(data, spread, FIELDS, parts=3),
                  "already holds a finished cache")


def check_write_dataset_resumes(tmp):
    """strict=True stops at the bad sample of part 1 (the other parts
    finish); the same call without strict resumes part 1 and gives the
    records of a one-process write."""
    start_ray()
    data = Samples(60, bad=25)
    local, spread = os.path.join(tmp, "local"), os.path.join(tmp, "ray")
    kiln.write_dataset(data, local, FIELDS, progress=False)
    expect_raises(RuntimeError, lambda: kiln.ray.write_dataset(data, spread, FIELDS, parts=3,
                                                               strict=True),
                  "part 1 of 3 failed", "sample 25")
    assert os.path.exists(os.path.join(spread, "part-00000-of-00003", "manifest.json"))
    assert not os.path.exists(os.path.join(spread, "part-00001-of-00003", "manifest.json"))
    kiln.ray.write_dataset(data, spread, FIELDS, parts=3)
    assert records(spread) == records(local)
    assert manifest(spread) == manifest(local)


def check_build_equals_kiln_build(tmp):
    """kiln.ray.build in three tasks (with a validation split) gives the
    records and manifests of kiln build on one machine."""
    start_ray()
    one, spread = os.path.join(tmp, "one"), os.path.join(tmp, "ray")
    args = ["--channels", "1", "--val-fraction", "0.2", "--norm", "auto"]
    subprocess.run([KILN_BIN, "build", FASHION, one, "--progress", "none"] + args, check=True)
    r = kiln.ray.build(FASHION, spread, *args, parts=3, kiln=KILN_BIN)
    assert r["records"] == 300 and r["rewritten_records"] == 0, r
    for split in ("train", "val"):
        a, b = os.path.join(one, split), os.path.join(spread, split)
        assert records(a) == records(b), split
        assert manifest(a) == manifest(b), split
        assert kiln.verify(b)["clean"]
    # A part that fails says which and why.
    expect_raises(RuntimeError, lambda: kiln.ray.build(os.path.join(tmp, "missing"),
                                                       os.path.join(tmp, "x"), parts=2,
                                                       kiln=KILN_BIN), "part 0 of 2 failed")


def check_ray_data(tmp):
    """A ray.data.Dataset, split into contiguous blocks in its order, gives
    the records of write_dataset of the same rows."""
    start_ray()
    rows = [{"image": np.full((3, 4 + i % 3, 5), i, dtype=np.uint8), "label": i % 3}
            for i in range(40)]
    fields = {"image": kiln.Field("uint8", (3, None, None)), "label": kiln.Field("int64", ())}
    local, spread = os.path.join(tmp, "local"), os.path.join(tmp, "ray")
    kiln.write_dataset(rows, local, fields, dataset="rows", progress=False)
    ds = ray.data.from_items(rows)
    kiln.ray.write_dataset(ds, spread, fields, parts=3, dataset="rows")
    assert records(spread) == records(local)
    assert manifest(spread) == manifest(local)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}

if __name__ == "__main__":
    sys.exit(run(CHECKS))
