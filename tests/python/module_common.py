"""Shared by the checks of the Python module kiln (test_kiln_module.py,
test_loader_handoff.py): the command line, small caches made by
tests/kiln_synth_cache, the C++ side's batches for byte-for-byte
comparison, and the runner.

A check file is run as CHECKFILE SYNTH_BIN DUMP_RECORDS_BIN DUMP_BATCHES_BIN
CHECK; SYNTH_BIN is tests/kiln_synth_cache (writes small caches with unique
pseudo-random records), the DUMP_* binaries are the C++ side
(kiln::CacheReader and kiln::Loader). CHECK names one check (CTest runs each
as its own test); "all" runs every one. The module is found through
PYTHONPATH (CTest sets it to build/python).

Exit 0 when the check passes, 1 otherwise, 77 (skipped) when /usr/bin/python3
lacks torch or numpy.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

# 77: CTest reports the test as skipped. Under KILN_TESTS_MUST_RUN=1 (tools/setup.sh test,
# CI) everything is installed, and a skip fails the test instead.
SKIP = 1 if os.environ.get("KILN_TESTS_MUST_RUN") == "1" else 77
try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: %s lacks a module: %s" % (sys.executable, e))
    sys.exit(SKIP)

import kiln  # noqa: E402  (PYTHONPATH: build/python)

if len(sys.argv) != 5:
    print(__doc__)
    sys.exit(2)
SYNTH, DUMP_RECORDS, DUMP_BATCHES, CHECK = sys.argv[1:5]
N = 103  # divides by neither the batch sizes nor the world sizes used here


def synth(tmp, name, dtype, shape=(3, 12, 10), n=N):
    out = os.path.join(tmp, name)
    subprocess.run([SYNTH, out, str(n)] + [str(d) for d in shape] + [dtype], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def cpp_batches(cache, **kv):
    """The epoch as kiln::Loader yields it, as kiln_dump_batches writes it."""
    out = cache + ".batches"
    subprocess.run([DUMP_BATCHES, cache, out] + ["%s=%d" % (k, int(v)) for k, v in kv.items()],
                   check=True)
    with open(out, "rb") as f:
        data = f.read()
    os.remove(out)
    return data


def parse_dump(data, sample_bytes):
    batches, pos = [], 0
    while pos < len(data):
        index, size = struct.unpack_from("<QQ", data, pos)
        pos += 16
        labels = data[pos:pos + 8 * size]
        pos += 8 * size
        x = data[pos:pos + size * sample_bytes]
        pos += size * sample_bytes
        assert len(x) == size * sample_bytes, "short dump"
        batches.append((index, labels, x))
    return batches


def py_batches(loader):
    return [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in loader]


def expect_raises(exc, fn, *needles):
    try:
        fn()
    except exc as e:
        for n in needles:
            assert n in str(e), "message %r lacks %r" % (str(e), n)
        return str(e)
    raise AssertionError("no %s raised" % exc.__name__)




def run(checks):
    """Runs the check named on the command line (or all of them)."""
    names = list(checks) if CHECK == "all" else [CHECK]
    failed = 0
    for name in names:
        if name not in checks:
            print("unknown check %r; known: %s" % (name, ", ".join(checks)))
            return 2
        tmp = tempfile.mkdtemp(prefix="kiln_module_test.")
        try:
            checks[name](tmp)
            print("ok   %s" % name)
        except Exception:
            import traceback
            traceback.print_exc(file=sys.stdout)
            print("FAIL %s" % name)
            failed += 1
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0
