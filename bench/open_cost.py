#!/usr/bin/python3
"""What opening a cache costs: kiln.Cache(CACHE) timed in two builds of the module, interleaved.

usage: bench/open_cost.py CACHE OLD_PYTHONPATH NEW_PYTHONPATH [ROUNDS=15]

Each round opens CACHE once with each module (old first on even rounds, new first on odd
ones), each in a fresh process so that nothing stays open between them, warm (the files
in the page cache: one untimed open first) and cold (the shard files evicted with
posix_fadvise(DONTNEED) just before). Prints the median seconds of each, new - old and
new / old, and, as the floor of a walk that reads every page, one sequential read of the
shard files, warm and cold. Only kiln.Cache(...) is timed, not the imports.
A measurement, not a test: exit 0 whatever the figures, 2 on a usage error.
"""
import json
import os
import statistics
import subprocess
import sys

PROBE = r"""
import json, os, sys, time
path, cold = sys.argv[1], sys.argv[2] == "1"
import kiln
if cold:
    with open(os.path.join(path, "manifest.json")) as f:
        for s in json.load(f)["shards"]:
            fd = os.open(os.path.join(path, s["file"]), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
t = time.perf_counter()
c = kiln.Cache(path)
print(time.perf_counter() - t)
"""

READ = r"""
import json, os, sys, time
path, cold = sys.argv[1], sys.argv[2] == "1"
with open(os.path.join(path, "manifest.json")) as f:
    files = [os.path.join(path, s["file"]) for s in json.load(f)["shards"]]
for f in files:
    fd = os.open(f, os.O_RDONLY)
    if cold:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
t = time.perf_counter()
for f in files:
    with open(f, "rb", buffering=0) as h:
        while h.read(1 << 20):
            pass
print(time.perf_counter() - t)
"""


def run(code, path, cold, pythonpath=None):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", code, path, "1" if cold else "0"], env=env,
                         check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    return float(out.split()[-1])


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__)
        return 2
    path, old, new = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) == 5 else 15
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    size = sum(s["bytes"] for s in m["shards"])
    print("%s: %d records in %d shard(s), %.1f MB; %d rounds" %
          (path, m["count"], len(m["shards"]), size / 1e6, rounds))
    for cold in (False, True):
        t = {"old": [], "new": [], "read": []}
        for r in range(rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                mod = old if which == "old" else new
                if not cold:
                    run(PROBE, path, False, mod)  # the files into the page cache
                t[which].append(run(PROBE, path, cold, mod))
            t["read"].append(run(READ, path, cold))
        o, n, rd = (statistics.median(t[k]) for k in ("old", "new", "read"))
        print("  %s open: old %.4f s, new %.4f s: new - old %+.4f s, new / old %.2f; "
              "one read of the shards %.4f s (new - old = %.2f of it)" %
              ("cold" if cold else "warm", o, n, n - o, n / o if o else 0, rd,
               (n - o) / rd if rd else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
