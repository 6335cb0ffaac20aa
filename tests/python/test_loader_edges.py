#!/usr/bin/python3
"""kiln.Loader where it went wrong unseen: the center crop and damaged shards.

Usage: test_loader_edges.py SYNTH_BIN DAMAGE_BIN CHECK

SYNTH_BIN is tests/kiln_synth_cache, DAMAGE_BIN tests/kiln_damage_shard (the
page-header damage generator the C++ tests use); the module is found
through PYTHONPATH. CHECK is one of:

center_crop: torchvision puts CenterCrop(K) at int(round((h - K) / 2)),
  Python's round: half to even, so a margin of 5 starts at 2, one of 7 at 4.
  Records whose margins are odd and even (1, 3, 5, 7 and 0, 2, 4, 6), in
  uint8 and float16, loaded with kiln.Loader(crop=K, shuffle=False) equal
  CenterCrop(K) of the same records read through kiln.Cache. A floor
  (7 -> 3, 3 -> 1) or rounding half up (5 -> 3, 1 -> 1) fails.

damaged_shards: a cache of the sample cache's shape (300 float16 1x28x28
  records, two to a LMDB leaf page); for seeds 1..300, the bytes DAMAGE_BIN
  names (1-4 of the first 64 of one page) are written into a copy of its
  shard and a fresh kiln.Loader with the defaults (verify=False) reads an
  epoch of it. Each try raises kiln.CorruptionError naming the shard, or
  yields the epoch as written; a crash by signal ends this process (the
  seed is printed before each try). With only the meta pages checked at
  open, 2 of 150 such tries died inside LMDB's page traversal.

Exit 0 when the check passes, 1 otherwise, 77 (skipped) when
/usr/bin/python3 lacks numpy, torch or torchvision.
"""
import os
import shutil
import subprocess
import sys
import tempfile

# 77: CTest reports the test as skipped. Under KILN_TESTS_MUST_RUN=1 (tools/setup.sh test,
# CI) everything is installed, and a skip fails the test instead.
SKIP = 1 if os.environ.get("KILN_TESTS_MUST_RUN") == "1" else 77
try:
    import numpy as np
    import torch
    from torchvision.transforms import CenterCrop
except ImportError as e:
    print("SKIP: %s lacks a module: %s" % (sys.executable, e))
    sys.exit(SKIP)

import kiln  # noqa: E402  (PYTHONPATH: build/python)


def synth(synth_bin, path, n, shape, dtype):
    subprocess.run([synth_bin, path, str(n)] + [str(d) for d in shape] + [dtype], check=True,
                   stdout=subprocess.DEVNULL)


def check_center_crop(tmp, synth_bin, _):
    k, n = 4, 13
    # (C, H, W): the margins H - k and W - k, odd and even.
    for shape in [(2, k + 7, k + 4), (1, k + 5, k + 1), (3, k + 3, k + 6), (1, k, k + 2)]:
        for dtype in ("uint8", "float16"):
            path = os.path.join(tmp, "%s-%dx%dx%d" % ((dtype,) + shape))
            synth(synth_bin, path, n, shape, dtype)
            cache = kiln.Cache(path)
            want = [CenterCrop(k)(torch.from_numpy(np.array(cache[i]["image"]))) for i in range(n)]
            loader = kiln.Loader(path, batch_size=5, shuffle=False, crop=k, drop_last=False)
            got = [torch.as_tensor(np.array(s)) for x, _ in loader for s in x]
            assert len(got) == n, "%d samples of %d" % (len(got), n)
            for i in range(n):
                assert torch.equal(got[i], want[i]), (
                    "%s %s record %d: kiln.Loader's crop differs from CenterCrop(%d), which "
                    "starts at (offset, margin) %s" %
                    (dtype, shape, i, k, [(int(round((d - k) / 2.0)), d - k) for d in shape[1:]]))
            print("  %s %dx%dx%d, margins %d and %d: as CenterCrop" %
                  ((dtype,) + shape + (shape[1] - k, shape[2] - k)))


def epoch(path):
    """One epoch of kiln.Loader(path) with the defaults, as bytes."""
    loader = kiln.Loader(path, batch_size=32)
    return [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in loader]


def check_damaged_shards(tmp, synth_bin, damage_bin):
    tries = 300
    path = os.path.join(tmp, "cache")
    synth(synth_bin, path, 300, (1, 28, 28), "float16")
    want = epoch(path)
    lines = subprocess.run([damage_bin, os.path.join(path, "shard-00000.mdb"), "1", str(tries)],
                           check=True, stdout=subprocess.PIPE,
                           universal_newlines=True).stdout.splitlines()
    assert len(lines) == tries, lines[-3:]
    refused = 0
    for line in lines:
        seed, page, *writes = line.split()
        # A fresh copy: a new file, which no earlier loader can still map.
        copy = os.path.join(tmp, "try" + seed)
        shutil.copytree(path, copy)
        shard = os.path.join(copy, "shard-00000.mdb")
        with open(shard, "r+b") as f:
            for w in writes:
                offset, value = w.split(":")
                f.seek(int(offset))
                f.write(bytes([int(value)]))
        print("  seed %s: page %s, bytes %s" % (seed, page, " ".join(writes)), flush=True)
        try:
            assert epoch(copy) == want, "seed %s: an epoch without an error, but other bytes" % seed
        except kiln.CorruptionError as e:
            assert shard in str(e), "seed %s: the error does not name %s: %s" % (seed, shard, e)
            refused += 1
        shutil.rmtree(copy)
    print("  %d of %d damaged shards refused, naming the shard; the rest read as written" %
          (refused, tries))
    assert refused > 0, "no damaged shard refused"


if __name__ == "__main__":
    checks = {"center_crop": check_center_crop, "damaged_shards": check_damaged_shards}
    if len(sys.argv) != 4 or sys.argv[3] not in checks:
        print(__doc__)
        sys.exit(2)
    tmp = tempfile.mkdtemp(prefix="kiln_loader_edges.")
    try:
        checks[sys.argv[3]](tmp, *sys.argv[1:3])
        print("ok   " + sys.argv[3])
    except AssertionError as e:
        print("FAIL %s: %s" % (sys.argv[3], e))
        sys.exit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
