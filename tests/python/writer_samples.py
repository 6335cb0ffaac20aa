"""The samples of test_writer.py, also imported by its child processes
(kept apart from module_common, which reads the test's command line)."""
import numpy as np

import kiln

FIELDS = {"image": kiln.Field("uint8", (3, None, None)),
          "mask": kiln.Field("uint8", (None, None)),
          "boxes": kiln.Field("float32", (None, 4)),
          "labels": kiln.Field("int64", (None,)),
          "score": kiln.Field("float16", (2,)),
          "weight": kiln.Field("int32", ()),
          "label": kiln.Field("int64", ())}


def sample(i):
    """Sample i of FIELDS: sizes vary with i; i % 3 boxes (0 happens)."""
    rng = np.random.default_rng(i)
    h, w = 5 + i % 7, 9 + i % 4
    return {"image": rng.integers(0, 256, (3, h, w), dtype=np.uint8),
            "mask": rng.integers(0, 3, (h, w), dtype=np.uint8),
            "boxes": rng.random((i % 3, 4), dtype=np.float32),
            "labels": np.arange(i % 4 + 1, dtype=np.int64),
            "score": np.array([i, 0.5], dtype=np.float16),
            "weight": i * 3,
            "label": i % 5}


class Samples:
    """A map-style dataset of sample(first + i); item `bad` raises, `misfit`
    has a float64 mask; `delay` seconds per item after item `slow_after`."""

    def __init__(self, n, bad=None, misfit=None, delay=0.0, slow_after=None, first=0):
        self.n, self.bad, self.misfit = n, bad, misfit
        self.delay, self.slow_after, self.first = delay, slow_after, first

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise OSError("cannot read sample %d" % i)
        if self.slow_after is not None and i > self.slow_after:
            import time
            time.sleep(self.delay)
        s = sample(self.first + i)
        if i == self.misfit:
            s["mask"] = s["mask"].astype(np.float64)
        return s
