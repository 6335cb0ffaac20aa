// What the loader's batches hold for a cache and options: the image's
// output shape and dtype, the slot sizes, the other fields' layouts.
#include "core/loader_output.h"

#include <algorithm>

namespace kiln {
namespace internal {

// The stored image field: its spec (format 1: made from the manifest).
FieldSpec ImageSpec(const Manifest& m) {
  if (!m.fields.empty()) return m.fields[m.image_field];
  FieldSpec f;
  f.name = "image";
  f.dtype = m.dtype;
  f.ndim = m.shape.ndim;
  for (int i = 0; i < m.shape.ndim; ++i) f.dims[i] = f.max_dims[i] = m.shape.dims[i];
  return f;
}

// Whether samples go through a SampleWriter (resampled or converted)
// rather than the window copy.
bool UsesWriter(const Manifest& m, const LoaderOptions& o) {
  return o.crop_kind != CropKind::kWindow || (o.output_dtype && *o.output_dtype != m.dtype) ||
         ImageSpec(m).codec != Codec::kRaw;  // a JPEG is decoded into planes, then written
}

// The output shape for a crop of `crop` (the checks of LoaderOutputShape).
Status OutputShapeFor(const Manifest& m, const LoaderOptions& o, uint32_t crop, Shape* out) {
  const FieldSpec image = ImageSpec(m);
  if (!IsPixelDType(image.dtype))
    return Status::InvalidArgument(std::string("loader: the cache's image field is ") +
                                   DTypeName(image.dtype) +
                                   "; the loader batches uint8, float16 or "
                                   "float32 images");
  if (o.output_dtype) {
    const DType want = *o.output_dtype;
    const bool same = want == image.dtype;
    const bool normalizes =
        image.dtype == DType::kUint8 && (want == DType::kFloat16 || want == DType::kFloat32);
    if (!same && !normalizes)
      return Status::InvalidArgument(std::string("loader: cannot turn the cache's ") +
                                     DTypeName(image.dtype) + " images into " + DTypeName(want) +
                                     " (the loader normalizes uint8 images into float16 or "
                                     "float32)");
  }
  if (o.crop_kind == CropKind::kWindow) {
    if (!image.fixed())
      return Status::InvalidArgument(
          "loader: the cache's '" + image.name + "' field varies in size from record to record (" +
          image.ShapeText() +
          "): batching it needs an output geometry that resizes each image to one size - "
          "RandomResizedCrop for training or Resize + CenterCrop for evaluation "
          "(kiln.Loader(crop=kiln.RandomResizedCrop(224)) or crop=kiln.ResizeCenterCrop(256, "
          "224); kiln train --augment rrc); a plain crop cuts a window of records of one size");
    *out = image.FixedShape();
    const bool converts = o.output_dtype && *o.output_dtype != image.dtype;
    if (crop == 0 && !o.random_flip && !converts) return Status::OK();
    if (out->ndim != 3)
      return Status::InvalidArgument("loader: crop/flip/dtype need CHW records, the cache holds " +
                                     out->ToString());
    if (converts && out->dims[0] > 4)
      return Status::InvalidArgument(
          "loader: normalizing needs 1 to 4 channels, the records have " +
          std::to_string(out->dims[0]));
    if (crop > 0) {
      if (crop > out->dims[1] || crop > out->dims[2])
        return Status::InvalidArgument("loader: crop " + std::to_string(crop) +
                                       " is larger than the records' " + out->ToString());
      out->dims[1] = out->dims[2] = crop;
    }
    return Status::OK();
  }
  const char* what =
      o.crop_kind == CropKind::kRandomResized ? "RandomResizedCrop" : "Resize + CenterCrop";
  // The one flag to change: a whole-image cache was built with a float
  // --dtype (kiln build stores whole images as uint8 unless told otherwise);
  // a fixed-size one needs whole images as well.
  if (image.dtype != DType::kUint8)
    return Status::InvalidArgument(
        std::string("loader: ") + what + " resamples uint8 images, and this cache holds " +
        DTypeName(image.dtype) + " ones: " +
        (image.fixed() ? "rebuild it with --max-side N (or --shorter-side N) in place of "
                         "--resize/--crop/--size: whole images, stored as uint8; or use a "
                         "plain crop"
                       : "rebuild it without --dtype " + std::string(DTypeName(image.dtype)) +
                             " (kiln build stores whole images as uint8 by default)"));
  if (image.ndim != 3 || image.dims[0] < 1 || image.dims[0] > 4)
    return Status::InvalidArgument(std::string("loader: ") + what +
                                   " needs CHW images of 1 to 4 channels, the cache's '" +
                                   image.name + "' field is " + image.ShapeText());
  if (crop == 0)
    return Status::InvalidArgument(std::string("loader: ") + what + " needs an output size");
  if (o.crop_kind == CropKind::kRandomResized) KILN_RETURN_IF_ERROR(CheckRandomResizedCrop(o.rrc));
  *out = Shape{};
  out->ndim = 3;
  out->dims[0] = static_cast<uint32_t>(image.dims[0]);
  out->dims[1] = out->dims[2] = crop;
  return Status::OK();
}

bool MovesPixels(const LoaderOptions& o) {
  return o.crop_kind != CropKind::kWindow || o.crop > 0 || o.random_flip;
}

}  // namespace internal

using internal::ImageSpec;
using internal::OutputShapeFor;

Status LoaderOutputShape(const Manifest& m, const LoaderOptions& o, Shape* out) {
  return OutputShapeFor(m, o, o.crop, out);
}

Status LoaderOutputDType(const Manifest& m, const LoaderOptions& o, DType* out) {
  Shape shape;
  KILN_RETURN_IF_ERROR(OutputShapeFor(m, o, o.crop, &shape));
  *out = o.output_dtype ? *o.output_dtype : ImageSpec(m).dtype;
  return Status::OK();
}

Status LoaderSlotBytes(const Manifest& m, const LoaderOptions& o, uint64_t* out) {
  if (o.max_crop > 0 && o.max_crop < o.crop)
    return Status::InvalidArgument("loader: max_crop " + std::to_string(o.max_crop) +
                                   " is smaller than the crop " + std::to_string(o.crop));
  Shape shape;
  DType dtype;
  KILN_RETURN_IF_ERROR(OutputShapeFor(m, o, std::max(o.crop, o.max_crop), &shape));
  KILN_RETURN_IF_ERROR(LoaderOutputDType(m, o, &dtype));
  *out = shape.NumElements() * DTypeSize(dtype) * o.batch_size;
  return Status::OK();
}

Status LoaderFields(const Manifest& m, const LoaderOptions& o, std::vector<LoaderField>* out) {
  out->clear();
  if (m.fields.empty()) return Status::OK();
  const FieldSpec image = ImageSpec(m);
  Shape image_out;
  KILN_RETURN_IF_ERROR(OutputShapeFor(m, o, o.crop, &image_out));
  const bool moves = internal::MovesPixels(o) && image.ndim == 3;
  for (int i = 0; i < static_cast<int>(m.fields.size()); ++i) {
    if (i == m.image_field || i == m.label_field) continue;
    const FieldSpec& f = m.fields[i];
    LoaderField lf;
    lf.name = f.name;
    lf.index = i;
    lf.dtype = f.dtype;
    lf.shape.ndim = f.ndim;
    for (int d = 0; d < f.ndim; ++d) lf.shape.dims[d] = f.max_dims[d];
    if (moves && IsMaskField(f, image)) {
      lf.role = LoaderField::kMask;
      lf.shape.dims[f.ndim - 2] = image_out.dims[1];
      lf.shape.dims[f.ndim - 1] = image_out.dims[2];
    } else {
      if (moves && IsBoxesField(f)) lf.role = LoaderField::kBoxes;
      for (int d = 0; d < f.ndim; ++d)
        if (f.dims[d] == FieldSpec::kVariableDim) lf.variable[lf.variable_dims++] = d;
    }
    lf.sample_bytes = FieldElements(lf.shape) * DTypeSize(f.dtype);
    out->push_back(lf);
  }
  return Status::OK();
}

}  // namespace kiln
