#!/usr/bin/env python3
"""WebDataset peer of bench/peers_bench.sh (run with the peers venv's python).

  convert SRC OUT [workers=2]
      webdataset.ShardWriter(OUT/shard-%06d.tar, maxcount=...) fed by a
      Pool of `workers` processes making each image's JPEG bytes (resized
      so its longer side is at most 256, quality 90:
      peer_common.resized_jpeg): one sample per image, {"__key__",
      "jpg": bytes, "cls": label}, in a seeded shuffled order (a tar is read
      sequentially: shuffling happens at write time, then per shard and in
      a buffer at read time). Also writes OUT/count (the sample count).
      Prints: wds_convert images=N seconds=S images_per_s=R bytes=B
  epoch OUT rrc|center [workers=2] [batch=256]
      one epoch of webdataset.WebDataset(shards, shardshuffle=(rrc))
      .shuffle(1000) (rrc only) .decode("pil") .to_tuple("jpg", "cls")
      .map_tuple(peer_common.transform, int) .batched(batch, partial=True)
      through webdataset.WebLoader(batch_size=None, num_workers=workers).
      Prints: wds_epoch mode=M images=N seconds=S images_per_s=R

Configuration, from the WebDataset docs ("Sharding, Parallel I/O, and
DataLoader": webdataset.github.io/webdataset/sharding/, and the
wds-distributed example, github.com/tmbdev/wds-distributed):
  - batching inside the workers (.batched(...)) and WebLoader with
    batch_size=None: "transferring individual samples is slow".
  - the default split_by_worker deals whole shards to the workers, so there
    must be several shards per worker: ShardWriter's defaults (maxcount
    100000, maxsize 3e9) would put the bench corpus in one tar and leave a
    worker idle; OUT gets 16 shards (8 per worker), each still read
    sequentially.
  - shardshuffle + a 1000-sample shuffle buffer for training (the docs'
    example), none for evaluation; the last partial batch of each worker
    kept (partial=True), so every image is seen once.
"""
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

USAGE = "usage: wds_peer.py convert SRC OUT [workers=2] | epoch OUT rrc|center [workers=2] [batch=256]"
SHARDS = 16


def convert(src, out, workers):
    from multiprocessing import Pool
    import webdataset as wds
    items = pc.listing(src)
    random.Random(0).shuffle(items)
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    with Pool(workers) as pool, wds.ShardWriter(os.path.join(out, "shard-%06d.tar"),
                                                maxcount=math.ceil(len(items) / SHARDS),
                                                verbose=0) as sink:
        for i, (blob, (_, label)) in enumerate(zip(
                pool.imap(pc.resized_jpeg, [p for p, _ in items], chunksize=16), items)):
            sink.write({"__key__": "%08d" % i, "jpg": blob, "cls": label})
    dt = time.perf_counter() - t0
    with open(os.path.join(out, "count"), "w") as f:
        f.write("%d\n" % len(items))
    print(f"wds_convert images={len(items)} seconds={dt:.3f} images_per_s={len(items) / dt:.1f} "
          f"bytes={pc.tree_bytes([out])} shards={len(shards(out))}", flush=True)


def shards(out):
    return sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))


def epoch(out, mode, workers, batch):
    import webdataset as wds
    tf = pc.transform(mode)
    train = mode == "rrc"

    def loader():
        ds = wds.WebDataset(shards(out), shardshuffle=len(shards(out)) if train else False,
                            empty_check=False)
        if train:
            ds = ds.shuffle(1000)
        ds = ds.decode("pil").to_tuple("jpg", "cls").map_tuple(tf, int).batched(batch, partial=True)
        return wds.WebLoader(ds, batch_size=None, num_workers=workers)

    pc.timed_epoch("wds", mode, batch, loader)


if __name__ == "__main__":
    pc.peer_main(USAGE, convert, epoch)
