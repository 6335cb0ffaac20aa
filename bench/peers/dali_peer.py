#!/usr/bin/env python3
"""NVIDIA DALI peer of bench/peers_bench.sh, CPU operators only (run with the
peers venv's python; no GPU is needed or used).

  convert SRC OUT
      nothing to convert: DALI reads the image files as they are. Prints
      dali_convert images=N seconds=0 images_per_s=0 bytes=B (B: SRC's files)
      and writes nothing (OUT is ignored; `epoch` takes the image tree).
  epoch ROOT rrc|center [workers=2] [batch=256]
      one epoch of a DALI pipeline (batch_size=batch, num_threads=workers,
      device_id=None: a CPU-only pipeline) over the ImageFolder tree ROOT,
      through nvidia.dali.plugin.pytorch.DALIGenericIterator
      (reader_name="Reader", LastBatchPolicy.PARTIAL: every image once):
        fn.readers.file(file_root=ROOT, random_shuffle=(rrc), name="Reader")
        rrc:    fn.decoders.image_random_crop(device="cpu", RGB, area
                [0.08, 1], aspect [3/4, 4/3]) + fn.resize(224 x 224) -
                or, with DALI_RRC=separate, fn.decoders.image(device="cpu")
                + fn.random_resized_crop(size=224) (the same crop, the whole
                image decoded first)
        center: fn.decoders.image(device="cpu", RGB) + fn.resize(resize_shorter=256)
        then fn.crop_mirror_normalize(dtype=FLOAT16, output_layout="CHW",
        crop=(224, 224), mean/std = ImageNet x 255, mirror=coin_flip (rrc)).
      Prints: dali_epoch mode=M images=N seconds=S images_per_s=R

Configuration, from DALI's docs: the Getting Started page
(docs.nvidia.com/deeplearning/dali/user-guide/docs/examples/getting_started.html:
pipeline_def, fn.readers.file, device="cpu" operators, num_threads) and
its ResNet-50 PyTorch example (docs/examples/use_cases/pytorch/resnet50 in
the DALI repository: create_dali_pipeline with dali_cpu=True), whose
training path is decoders.image_random_crop + resize + crop_mirror_normalize
(the fused decoder decodes only the crop's region) and whose evaluation path
is decoders.image + resize(resize_shorter) + crop_mirror_normalize(crop).
num_threads = the 2 workers every side gets; prefetch_queue_depth the
default 2. DALI reads the bench corpus's own files (shorter side 256-500 px)
- it has no converted form; the other peers read images of longer side 256.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

USAGE = "usage: dali_peer.py convert SRC OUT | epoch ROOT rrc|center [workers=2] [batch=256]"


def epoch(root, mode, workers, batch):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    train = mode == "rrc"
    separate = os.environ.get("DALI_RRC", "fused") == "separate"

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=None)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=train, name="Reader")
        if train and not separate:
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=[0.08, 1.0],
                                                   random_aspect_ratio=[3 / 4, 4 / 3])
            images = fn.resize(images, resize_x=pc.CROP, resize_y=pc.CROP)
        elif train:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(images, size=[pc.CROP, pc.CROP],
                                            random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3])
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=pc.RESIZE)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT16, output_layout="CHW", crop=(pc.CROP, pc.CROP),
            mean=[m * 255 for m in pc.MEAN], std=[s * 255 for s in pc.STD],
            mirror=fn.random.coin_flip() if train else 0)
        return images, labels

    def loader():
        pipe = pipeline()
        pipe.build()
        return DALIGenericIterator(pipe, ["x", "y"], reader_name="Reader",
                                   last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)

    pc.timed_epoch("dali", mode, batch, loader, images_of=lambda b: b[0]["x"])


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "convert":
        n = len(pc.listing(a[1]))
        print(f"dali_convert images={n} seconds=0 images_per_s=0 bytes={pc.tree_bytes([a[1]])}")
    elif a and a[0] == "epoch":
        epoch(*pc.epoch_args(a, USAGE))
    else:
        sys.exit(USAGE)
