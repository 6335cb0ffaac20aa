#!/usr/bin/env python3
"""MosaicML Streaming peer of bench/peers_bench.sh (run with the peers venv's python).

  convert SRC OUT [workers=2]
      streaming.MDSWriter(out=OUT, columns={"image": "bytes", "label": "int"})
      fed by a Pool of `workers` processes making each image's JPEG bytes
      (resized so its longer side is at most 256, quality 90:
      peer_common.resized_jpeg), shards of the default size_limit (64 MiB,
      but see convert() and below), no compression, in the ImageFolder order.
      Prints: streaming_convert images=N seconds=S images_per_s=R bytes=B
  epoch OUT rrc|center [workers=2] [batch=256]
      one epoch of streaming.StreamingDataset(local=OUT, remote=None,
      shuffle=(rrc), batch_size=batch) through streaming.StreamingDataLoader
      (batch_size=batch, num_workers=workers); each sample's bytes opened
      with PIL (what the "jpeg" encoding's decode does), then
      peer_common.transform.
      Prints: streaming_epoch mode=M images=N seconds=S images_per_s=R

Configuration, from the Streaming docs (docs.mosaicml.com/projects/streaming:
"Basic Dataset Conversion", "Performance Tuning", the StreamingDataset API
page):
  - the column holds the JPEG bytes ("bytes"): the "jpeg" encoding would
    re-encode a PIL image at PIL's default quality 75 (it keeps a file's own
    bytes only for an image opened from a file); its decode is
    Image.open(BytesIO(data)), which __getitem__ below does itself.
  - local=OUT with no remote: the shards are read in place (no download, no
    copy); batch_size passed to StreamingDataset as the docs ask (its
    partitioning is per batch); shuffle_algo the default py1e.
  - shards: the default size_limit is 1 << 26 (64 MiB), which would put the
    whole 4000-image bench corpus (about 60 MB) in one shard; shards are
    sized to make at least 8 (shard_bytes in convert()) so both workers have shards.
  - clean_stale_shared_memory() first, as the docs advise after a killed run.
"""
import io
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

USAGE = "usage: streaming_peer.py convert SRC OUT [workers=2] | epoch OUT rrc|center [workers=2] [batch=256]"


def convert(src, out, workers):
    from multiprocessing import Pool
    from streaming import MDSWriter
    items = pc.listing(src)
    # At most the default 64 MiB, and at least 8 shards (about 17 KB per image).
    shard_bytes = max(1 << 20, min(1 << 26, len(items) * 17_000 // 8))
    t0 = time.perf_counter()
    with Pool(workers) as pool, MDSWriter(out=out, columns={"image": "bytes", "label": "int"},
                                          size_limit=shard_bytes) as writer:
        for blob, (_, label) in zip(pool.imap(pc.resized_jpeg, [p for p, _ in items], chunksize=16),
                                    items):
            writer.write({"image": blob, "label": label})
    dt = time.perf_counter() - t0
    print(f"streaming_convert images={len(items)} seconds={dt:.3f} "
          f"images_per_s={len(items) / dt:.1f} bytes={pc.tree_bytes([out])} "
          f"shard_bytes={shard_bytes}", flush=True)


def epoch(out, mode, workers, batch):
    from PIL import Image
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    tf = pc.transform(mode)

    class Dataset(StreamingDataset):
        def __getitem__(self, index):
            obj = super().__getitem__(index)
            return tf(Image.open(io.BytesIO(obj["image"])).convert("RGB")), obj["label"]

    pc.timed_epoch("streaming", mode, batch, lambda: StreamingDataLoader(
        Dataset(local=out, remote=None, shuffle=(mode == "rrc"), batch_size=batch),
        batch_size=batch, num_workers=workers))


if __name__ == "__main__":
    pc.peer_main(USAGE, convert, epoch)
