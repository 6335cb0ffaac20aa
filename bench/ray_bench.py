#!/usr/bin/python3
"""bench/ray_bench.sh's runs: a cache of the bench corpus made four ways,
interleaved, on a local Ray cluster of 2 CPUs (started once, untimed):

  kiln build      `kiln build SRC OUT --max-side 256 --dtype uint8 --norm imagenet --threads 2`
  kiln.ray.build  the same arguments in 2 Ray tasks (--num-parts 2, --threads 1 each),
                  then kiln merge
  write_dataset   kiln.write_dataset of the corpus as a map-style dataset (PIL decode +
                  resize to a longer side of 256, bench/append_bench.py's Slice), 2 workers
  kiln.ray.write_dataset  the same dataset in 2 Ray tasks of 1 CPU, then kiln merge

usage: ray_bench.py SRC OUT KILN ROUNDS
Prints each round's seconds and the ratios ray/local for both, then checks that the
Ray build holds the records of kiln build and the Ray write_dataset those of
write_dataset, record for record.
"""
import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
import numpy as np  # noqa: E402
import ray  # noqa: E402

import kiln  # noqa: E402
import kiln.ray  # noqa: E402
from append_bench import Slice  # noqa: E402

ARGS = ["--max-side", "256", "--dtype", "uint8", "--norm", "imagenet"]
FIELDS = {"image": kiln.Field("uint8", (3, None, None)), "label": kiln.Field("int64", ())}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def same_records(a, b):
    x, y = kiln.Cache(a), kiln.Cache(b)
    assert len(x) == len(y), (a, len(x), b, len(y))
    for i in range(len(x)):
        p, q = x.read(i, verify=True), y.read(i, verify=True)
        assert p.keys() == q.keys() and all(np.array_equal(p[k], q[k]) for k in p), (a, b, i)
    return len(x)


def main():
    src, out, kiln_bin, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print("ray.init: %.1f s (untimed below)" % (time.perf_counter() - t0))
    data = Slice(src, 0, None)
    kw = dict(classes=data.classes, mean=MEAN, std=STD, dataset="corpus")
    q_build, q_write = [], []
    for r in range(1, rounds + 1):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        d = {k: os.path.join(out, k) for k in ("build", "raybuild", "write", "raywrite")}
        t = {}
        s = time.perf_counter()
        subprocess.run([kiln_bin, "build", src, d["build"], "--threads", "2", "--progress", "none"]
                       + ARGS, check=True, stdout=subprocess.DEVNULL)
        t["build"] = time.perf_counter() - s
        s = time.perf_counter()
        kiln.ray.build(src, d["raybuild"], *ARGS, parts=2, kiln=kiln_bin, num_cpus=1)
        t["raybuild"] = time.perf_counter() - s
        s = time.perf_counter()
        kiln.write_dataset(data, d["write"], FIELDS, workers=2, progress=False, **kw)
        t["write"] = time.perf_counter() - s
        s = time.perf_counter()
        kiln.ray.write_dataset(data, d["raywrite"], FIELDS, parts=2, num_cpus=1, **kw)
        t["raywrite"] = time.perf_counter() - s
        q_build.append(t["raybuild"] / t["build"])
        q_write.append(t["raywrite"] / t["write"])
        print("round %d: kiln build %.2f s, kiln.ray.build %.2f s (%.3f); write_dataset %.2f s, "
              "kiln.ray.write_dataset %.2f s (%.3f)"
              % (r, t["build"], t["raybuild"], q_build[-1], t["write"], t["raywrite"],
                 q_write[-1]))
    n = same_records(d["build"], d["raybuild"])
    with open(os.path.join(d["raybuild"], "manifest.json")) as f:
        m = json.load(f)
    print("kiln.ray.build: the records of kiln build (%d, %d shards)" % (n, len(m["shards"])))
    n = same_records(d["write"], d["raywrite"])
    print("kiln.ray.write_dataset: the records of write_dataset (%d)" % n)
    print("kiln.ray.build / kiln build (best of %d) = %.3f" % (rounds, min(q_build)))
    print("kiln.ray.write_dataset / write_dataset, 2 workers (best of %d) = %.3f"
          % (rounds, min(q_write)))
    print("write_dataset / kiln build (last round) = %.3f" % (t["write"] / t["build"]))
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
