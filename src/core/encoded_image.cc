#include "core/encoded_image.h"

#include <algorithm>
#include <cmath>

namespace kiln::internal {

int ChooseDctScale(int box_w, int box_h, int out_w, int out_h, bool dct_scaling) {
  if (!dct_scaling) return 1;
  for (int s : {8, 4, 2})
    if (static_cast<int64_t>(box_w) >= static_cast<int64_t>(out_w) * s &&
        static_cast<int64_t>(box_h) >= static_cast<int64_t>(out_h) * s)
      return s;
  return 1;
}

void Deinterleave(const uint8_t* src, size_t stride, int w, int h, int c, uint8_t* dst) {
  const size_t plane = static_cast<size_t>(w) * h;
  if (c == 1) {
    for (int y = 0; y < h; ++y) std::copy(src + y * stride, src + y * stride + w, dst + y * w);
    return;
  }
  for (int y = 0; y < h; ++y) {
    const uint8_t* s = src + y * stride;
    uint8_t* d0 = dst + static_cast<size_t>(y) * w;
    uint8_t* d1 = d0 + plane;
    uint8_t* d2 = d1 + plane;
    for (int x = 0; x < w; ++x) {
      d0[x] = s[3 * x];
      d1[x] = s[3 * x + 1];
      d2[x] = s[3 * x + 2];
    }
  }
}

Status EncodedImageReader::Decode(const FieldView& v, bool dct_scaling, const std::string& what,
                                  SamplePlan* plan) {
  const int c = static_cast<int>(v.shape.dims[0]);
  const int ih = static_cast<int>(v.shape.dims[1]), iw = static_cast<int>(v.shape.dims[2]);
  const CropBox b = plan->source;
  const int s = ChooseDctScale(b.width, b.height, plan->resized_w, plan->resized_h, dct_scaling);
  // The box in the image at 1/s, [x0, x1) x [y0, y1), fractional (exact
  // integers at s = 1); the pixels [left, left + need_w) x [top, top +
  // need_h) cover it.
  const double x0 = static_cast<double>(b.left) / s, x1 = static_cast<double>(b.left + b.width) / s;
  const double y0 = static_cast<double>(b.top) / s, y1 = static_cast<double>(b.top + b.height) / s;
  const int left = static_cast<int>(std::floor(x0)), top = static_cast<int>(std::floor(y0));
  const int sw = JpegScaledSize(iw, s), sh = JpegScaledSize(ih, s);
  const int need_w = std::max(1, std::min(sw, static_cast<int>(std::ceil(x1))) - left);
  const int need_h = std::max(1, std::min(sh, static_cast<int>(std::ceil(y1))) - top);
  const Status st =
      decoder_.Decode(v.data, v.bytes, iw, ih, c, s, left, top, need_w, need_h, &region_);
  if (!st.ok()) return Status::Corruption(what + ": " + st.message());
  // The region covers the box (Decoder::Decode's promise); copy the box out.
  const int rx = left - region_.x0, ry = top - region_.y0;
  if (rx < 0 || ry < 0 || rx + need_w > region_.width || ry + need_h > region_.height)
    return Status::Corruption(what + ": the JPEG decoder returned a region that misses the box");
  planes_.resize(static_cast<size_t>(need_w) * need_h * c);
  const size_t stride = static_cast<size_t>(region_.width) * c;
  Deinterleave(region_.pixels.data() + ry * stride + static_cast<size_t>(rx) * c, stride, need_w,
               need_h, c, planes_.data());
  width_ = need_w;
  height_ = need_h;
  scale_ = s;
  plan->source = CropBox{0, 0, need_h, need_w};
  if (s == 1) {
    plan->source_x0 = plan->source_y0 = plan->source_w = plan->source_h = 0;
  } else {
    plan->source_x0 = x0 - left;
    plan->source_y0 = y0 - top;
    plan->source_w = x1 - x0;
    plan->source_h = y1 - y0;
  }
  return Status::OK();
}

}  // namespace kiln::internal

namespace kiln {

Status DecodeField(const FieldView& v, const std::string& what, std::vector<uint8_t>* out) {
  if (v.codec == Codec::kRaw) {
    out->assign(v.data, v.data + v.bytes);
    return Status::OK();
  }
  const int c = static_cast<int>(v.shape.dims[0]);
  const int h = static_cast<int>(v.shape.dims[1]), w = static_cast<int>(v.shape.dims[2]);
  internal::Decoder decoder;
  internal::JpegRegion region;
  const Status st = decoder.Decode(v.data, v.bytes, w, h, c, 1, 0, 0, 0, 0, &region);
  if (!st.ok()) return Status::Corruption(what + ": " + st.message());
  out->resize(static_cast<size_t>(w) * h * c);
  internal::Deinterleave(region.pixels.data(), static_cast<size_t>(w) * c, w, h, c, out->data());
  return Status::OK();
}

}  // namespace kiln

namespace kiln {

Status CheckJpegForField(const FieldSpec& spec, const uint8_t* jpeg, size_t size, Shape* shape) {
  internal::JpegInfo info;
  Status st = internal::ReadJpegInfo(jpeg, size, &info);
  if (!st.ok()) return Status::InvalidArgument(st.message());
  const int c = spec.ndim == 3 && spec.dims[0] > 0 ? static_cast<int>(spec.dims[0]) : 3;
  if (info.components == 4)
    return Status::InvalidArgument("a CMYK JPEG: the field takes grayscale or colour JPEGs");
  if (c == 1 && info.components != 1)
    return Status::InvalidArgument("a colour JPEG for a one-channel field");
  shape->ndim = 3;
  shape->dims = {static_cast<uint32_t>(c), static_cast<uint32_t>(info.height),
                 static_cast<uint32_t>(info.width), 0};
  for (int i = 1; i < 3; ++i)
    if (spec.dims[i] != FieldSpec::kVariableDim && spec.dims[i] != shape->dims[i])
      return Status::InvalidArgument("a JPEG of " + std::to_string(info.width) + "x" +
                                     std::to_string(info.height) + " (width x height) for a field of " +
                                     spec.ShapeText());
  // Decoded whole once, so that what is stored is known to decode.
  internal::Decoder decoder;
  internal::JpegRegion region;
  st = decoder.Decode(jpeg, size, info.width, info.height, c, 1, 0, 0, 0, 0, &region);
  if (!st.ok()) return Status::InvalidArgument(st.message());
  return Status::OK();
}

Status EncodeJpegCHW(const uint8_t* chw, const Shape& shape, int quality,
                     std::vector<uint8_t>* out) {
  if (shape.ndim != 3 || (shape.dims[0] != 1 && shape.dims[0] != 3))
    return Status::InvalidArgument("a JPEG is made of a 1 or 3 x H x W image, not " +
                                   shape.ToString());
  const int c = static_cast<int>(shape.dims[0]);
  const int h = static_cast<int>(shape.dims[1]), w = static_cast<int>(shape.dims[2]);
  const size_t plane = static_cast<size_t>(w) * h;
  std::vector<uint8_t> hwc(plane * c);
  for (size_t p = 0; p < plane; ++p)
    for (int k = 0; k < c; ++k) hwc[p * c + k] = chw[k * plane + p];
  return internal::EncodeJpeg(hwc.data(), w, h, c, quality, out);
}

}  // namespace kiln
