#!/usr/bin/env python3
"""LitData peer of bench/peers_bench.sh (run with the peers venv's python).

  convert SRC OUT [workers=2]
      litdata.optimize over the ImageFolder tree SRC into OUT: per image a
      sample {"image": litdata.Jpeg(bytes=...), "label": int}, the JPEG
      bytes of the image resized so its longer side is at most 256
      (quality 90: peer_common.resized_jpeg; litdata keeps JPEG bytes at or
      under its quality cap of 95 as they are), num_workers=workers,
      uncompressed chunks (chunk_bytes: see convert() and below), inputs
      shuffled (seed 0) before optimize.
      Prints: litdata_convert images=N seconds=S images_per_s=R bytes=B
  epoch OUT rrc|center [workers=2] [batch=256]
      one epoch of litdata.StreamingDataset(OUT, shuffle=(rrc)) through
      litdata.StreamingDataLoader(batch_size=batch, num_workers=workers);
      the JPEG column comes out of litdata's deserializer as a uint8 CHW
      tensor (torchvision.io.decode_jpeg), then peer_common.transform.
      Prints: litdata_epoch mode=M images=N seconds=S images_per_s=R

Configuration, from the LitData README (pypi.org/project/litdata, "Optimize
images as JPEG (not raw PIL)", "FAQ: chunk size & shuffle before optimize")
and lightning.ai/docs/litdata/quick-start:
  - JPEG bytes, not PIL pixels ("often 10x+ larger"); quality 90 as the
    README's ImageNet scripts (--write_mode jpeg --quality 90).
  - chunk_bytes: the README's default is 64MB; a 64MB chunk would hold
    the whole 4000-image bench corpus (about 60 MB of JPEG), i.e. one chunk
    for two workers, so the chunk is sized for at least 8 chunks
    (chunk_bytes in convert()), as a user who sizes chunks for their workers would.
  - shuffle the inputs before optimize (the FAQ: chunks of one class each
    would make chunk-level shuffling poor; ImageFolder order is by class).
  - read in place: a local, uncompressed OUT is read where it is (no copy
    into litdata's cache directory); StreamingDataLoader with the same
    2 workers as every side.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

USAGE = "usage: litdata_peer.py convert SRC OUT [workers=2] | epoch OUT rrc|center [workers=2] [batch=256]"


def sample(item):
    import litdata as ld
    path, label = item
    return {"image": ld.Jpeg(bytes=pc.resized_jpeg(path)), "label": label}


def convert(src, out, workers):
    import litdata as ld
    items = pc.listing(src)
    random.Random(0).shuffle(items)
    # Chunks of at most 64MB (the README's default), and small enough that
    # the corpus makes at least 8 (estimate: 17 KB per image, the JPEG
    # size of the bench corpus's images at longer side 256, quality 90).
    chunk_bytes = max(1 << 20, min(64 << 20, len(items) * 17_000 // 8))
    t0 = time.perf_counter()
    ld.optimize(fn=sample, inputs=items, output_dir=out, chunk_bytes=chunk_bytes,
                num_workers=workers, mode="overwrite", verbose=False)
    dt = time.perf_counter() - t0
    print(f"litdata_convert images={len(items)} seconds={dt:.3f} "
          f"images_per_s={len(items) / dt:.1f} bytes={pc.tree_bytes([out])} "
          f"chunk_bytes={chunk_bytes}", flush=True)


def epoch(out, mode, workers, batch):
    import litdata as ld
    tf = pc.transform(mode)

    class Dataset(ld.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return tf(item["image"]), item["label"]

    pc.timed_epoch("litdata", mode, batch, lambda: ld.StreamingDataLoader(
        Dataset(out, shuffle=(mode == "rrc")), batch_size=batch, num_workers=workers))


if __name__ == "__main__":
    pc.peer_main(USAGE, convert, epoch)
