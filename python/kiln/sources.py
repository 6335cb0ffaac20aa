"""Where kiln.write_dataset's samples come from, and how their values become
the declared fields' arrays.

* A map-style dataset (``__len__`` and ``__getitem__``: a torch ``Dataset``,
  a Hugging Face ``datasets.Dataset``, a list of dicts) is read by index,
  in worker processes when asked.
* An iterable (a torch ``IterableDataset``, a generator, any object without
  ``__len__``) is read in the writer's process, in the order it yields.
* A ``datasets.Dataset`` gives its classes (a ``ClassLabel`` label column)
  and, for a JPEG field (``codec="jpeg"``), its ``Image`` column undecoded,
  so a JPEG within the field's channels is stored as its own bytes.
* A PIL image for an image field becomes the uint8 (C, H, W) array the
  field declares (``RGB`` for C 3, ``L`` for C 1); for an (H, W) field (a
  mask) its pixel values. The C++ writer checks everything else.
"""
import io
import sys


def is_iterable(dataset):
    """Whether `dataset` is read by iteration rather than by index."""
    tud = sys.modules.get("torch.utils.data")
    if tud is not None and isinstance(dataset, tud.IterableDataset):
        return True
    return not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"))


def _hf_features(dataset):
    if not type(dataset).__module__.startswith("datasets"):
        return None
    return getattr(dataset, "features", None)


def adapt(dataset, fields, writer_args):
    """The dataset write_dataset reads: a datasets.Dataset with its JPEG
    fields' Image columns undecoded, and ``classes`` (when not given) from
    its label column's ClassLabel names. Anything else as it is."""
    features = _hf_features(dataset)
    if features is None:
        return dataset
    import datasets
    label = writer_args.get("label_field") or "label"
    if writer_args.get("classes") is None and isinstance(features.get(label), datasets.ClassLabel):
        writer_args["classes"] = list(features[label].names)
    for name, f in fields.items():
        codec = f[2] if len(f) > 2 else None
        feature = features.get(name)
        if codec == "jpeg" and isinstance(feature, datasets.Image) and feature.decode:
            dataset = dataset.cast_column(name, datasets.Image(decode=False))
    if writer_args.get("dataset") is None:
        info = getattr(dataset, "info", None)
        name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
        writer_args["dataset"] = "datasets.Dataset" + (" " + name if name else "")
    return dataset


_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _is_pil(value):
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def _pil_array(image, dtype, shape):
    """A PIL image as the array of a field of `dtype` and `shape`."""
    import numpy as np
    if len(shape) == 3:
        mode = _MODES.get(shape[0]) or ("L" if image.mode in ("1", "L", "P") else "RGB")
        if image.mode != mode:
            image = image.convert(mode)
        a = np.asarray(image)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    else:
        a = np.asarray(image)
    a = np.ascontiguousarray(a)
    want = np.dtype(dtype)
    if a.dtype != want and a.dtype.kind in "iub" and want.kind in "iu":
        a = a.astype(want)
    return a


def _encoded_image(value, dtype, shape):
    """A Hugging Face undecoded image ({"bytes", "path"}) for a JPEG field:
    its bytes when they are a JPEG with the field's channels, else the
    decoded pixels (the writer encodes them)."""
    data = value.get("bytes")
    if data is None and value.get("path"):
        with open(value["path"], "rb") as f:
            data = f.read()
    if data is None:
        raise ValueError("the image has neither bytes nor a path")
    from PIL import Image
    image = Image.open(io.BytesIO(data))  # reads the header only
    channels = shape[0] if len(shape) == 3 else None
    fits = {1: ("L",), 3: ("RGB", "YCbCr")}.get(channels, ("L", "RGB", "YCbCr"))
    if data[:3] == b"\xff\xd8\xff" and image.format == "JPEG" and image.mode in fits:
        return bytes(data)
    return _pil_array(image, dtype, shape)


class Converter:
    """Makes a sample's values the arrays of the declared fields (in the
    worker that loaded it)."""

    def __init__(self, fields):
        self.specs = {}
        for name, f in fields.items():
            f = tuple(f) + (None,)
            self.specs[str(name)] = (str(f[0]), tuple(f[1]), f[2])

    def __call__(self, sample):
        out = {}
        for name, v in sample.items():
            spec = self.specs.get(name)
            if spec is not None:
                dtype, shape, codec = spec
                if _is_pil(v):
                    v = _pil_array(v, dtype, shape)
                elif codec == "jpeg" and isinstance(v, dict) and ("bytes" in v or "path" in v):
                    v = _encoded_image(v, dtype, shape)
            out[name] = v
        return out
