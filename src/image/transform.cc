// kiln::image transforms: torchvision geometry, PIL resampling, CHW output.
#include "kiln/image/transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pixels/resample.h"

namespace kiln::image {
namespace {

std::string Size(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

template <typename T, typename Map>
void Relayout(const ImageU8& in, T* dst, Map map) {
  const size_t plane = static_cast<size_t>(in.width) * in.height;
  const int c_count = in.channels;
  const uint8_t* src = in.pixels.data();
  for (int c = 0; c < c_count; ++c) {
    T* out = dst + c * plane;
    for (size_t i = 0; i < plane; ++i) out[i] = map(c, src[i * c_count + c]);
  }
}

}  // namespace

Status ResizeAndCrop(const ImageU8& in, const ResizeSpec& spec, ImageU8* out) {
  if (&in == out) return Status::InvalidArgument("ResizeAndCrop: input and output alias");
  if (in.width <= 0 || in.height <= 0 || in.channels < 1 || in.channels > 4 ||
      in.pixels.size() != static_cast<size_t>(in.width) * in.height * in.channels) {
    return Status::InvalidArgument("ResizeAndCrop: malformed input image " +
                                   Size(in.width, in.height) + "x" + std::to_string(in.channels));
  }
  const bool scaled = in.scale_num != in.scale_denom;
  const int src_w = in.source_width > 0 ? in.source_width : in.width;
  const int src_h = in.source_height > 0 ? in.source_height : in.height;
  if (!scaled && (src_w != in.width || src_h != in.height)) {
    return Status::InvalidArgument("ResizeAndCrop: source size " + Size(src_w, src_h) +
                                   " differs from pixel size " + Size(in.width, in.height) +
                                   " without a scale factor");
  }
  int rw, rh;
  KILN_RETURN_IF_ERROR(PlanResize(src_w, src_h, spec, &rw, &rh));
  // After DCT downscaling the source's extent in decoded pixels is
  // fractional (1001 px at 1/2 -> 500.5 of the 501 decoded columns).
  const double box_w =
      scaled ? static_cast<double>(src_w) * in.scale_num / in.scale_denom : in.width;
  const double box_h =
      scaled ? static_cast<double>(src_h) * in.scale_num / in.scale_denom : in.height;

  const int cw = spec.crop > 0 ? spec.crop : rw;
  const int ch = spec.crop > 0 ? spec.crop : rh;
  const int ox = CropOffset(rw, cw);
  const int oy = CropOffset(rh, ch);
  // The part of the resized image the crop keeps; the rest is zero padding.
  const int x_begin = ox > 0 ? ox : 0, x_end = ox + cw < rw ? ox + cw : rw;
  const int y_begin = oy > 0 ? oy : 0, y_end = oy + ch < rh ? oy + ch : rh;

  out->width = cw;
  out->height = ch;
  out->channels = in.channels;
  out->source_width = cw;
  out->source_height = ch;
  out->scale_num = out->scale_denom = 1;
  const size_t stride = static_cast<size_t>(cw) * in.channels;
  const bool padded = x_begin - ox > 0 || y_begin - oy > 0 || x_end - ox < cw || y_end - oy < ch;
  if (padded) {
    out->pixels.assign(stride * ch, 0);
  } else {
    out->pixels.resize(stride * ch);
  }
  uint8_t* dst = out->pixels.data() + static_cast<size_t>(y_begin - oy) * stride +
                 static_cast<size_t>(x_begin - ox) * in.channels;
  pixels::ResampleRegion(in.pixels.data(), in.width, in.height, in.channels, box_w, box_h, rw, rh,
                           x_begin, y_begin, x_end - x_begin, y_end - y_begin, dst, stride);
  return Status::OK();
}

Status ResizeAndCropNearest(const ImageU8& in, const ResizeSpec& spec, ImageU8* out) {
  if (&in == out) return Status::InvalidArgument("ResizeAndCropNearest: input and output alias");
  if (in.width <= 0 || in.height <= 0 || in.channels != 1 ||
      in.pixels.size() != static_cast<size_t>(in.width) * in.height)
    return Status::InvalidArgument("ResizeAndCropNearest: malformed mask " +
                                   Size(in.width, in.height));
  int rw, rh;
  KILN_RETURN_IF_ERROR(PlanResize(in.width, in.height, spec, &rw, &rh));
  const int cw = spec.crop > 0 ? spec.crop : rw;
  const int ch = spec.crop > 0 ? spec.crop : rh;
  const int ox = CropOffset(rw, cw), oy = CropOffset(rh, ch);
  // The input column (row) of each output one; -1 in the padding. PIL's
  // NEAREST resize (ImagingScaleAffine) walks the input in steps of in /
  // out from half a step, adding the step each pixel, and truncates: the
  // same float sums give the same picks (a product instead of the sum
  // picks another pixel where the sum falls just short of an integer).
  auto map = [](int n, int offset, int resized, int in_size, std::vector<int>* out_idx) {
    out_idx->assign(static_cast<size_t>(n), -1);
    const double step = static_cast<double>(in_size) / resized;
    double at = step * 0.5;
    for (int r = 0; r < resized && r < offset + n; ++r, at += step)
      if (r >= offset) (*out_idx)[r - offset] = std::min(in_size - 1, static_cast<int>(at));
  };
  std::vector<int> xs, ys;
  map(cw, ox, rw, in.width, &xs);
  map(ch, oy, rh, in.height, &ys);
  out->width = out->source_width = cw;
  out->height = out->source_height = ch;
  out->channels = 1;
  out->scale_num = out->scale_denom = 1;
  out->pixels.assign(static_cast<size_t>(cw) * ch, 0);
  for (int y = 0; y < ch; ++y) {
    if (ys[y] < 0) continue;
    const uint8_t* src = in.pixels.data() + static_cast<size_t>(ys[y]) * in.width;
    uint8_t* dst = out->pixels.data() + static_cast<size_t>(y) * cw;
    for (int x = 0; x < cw; ++x)
      if (xs[x] >= 0) dst[x] = src[xs[x]];
  }
  return Status::OK();
}

Status ToCHW(const ImageU8& in, DType dtype, const float* mean, const float* std, void* dst) {
  if (in.width <= 0 || in.height <= 0 || in.channels < 1 || in.channels > 4 ||
      in.pixels.size() != static_cast<size_t>(in.width) * in.height * in.channels) {
    return Status::InvalidArgument("ToCHW: malformed input image");
  }
  if (dst == nullptr) return Status::InvalidArgument("ToCHW: null destination");
  if ((mean == nullptr) != (std == nullptr)) {
    return Status::InvalidArgument("ToCHW: give both mean and std, or neither");
  }
  if (dtype == DType::kUint8) {
    Relayout(in, static_cast<uint8_t*>(dst), [](int, uint8_t v) { return v; });
    return Status::OK();
  }
  for (int c = 0; std != nullptr && c < in.channels; ++c) {
    if (!(std[c] != 0.0f)) return Status::InvalidArgument("ToCHW: std must be non-zero");
  }
  float table[4][256];
  NormalizeTable(mean, std, in.channels, table);
  if (dtype == DType::kFloat32) {
    Relayout(in, static_cast<float*>(dst), [&](int c, uint8_t v) { return table[c][v]; });
    return Status::OK();
  }
  uint16_t half_table[4][256];
  for (int c = 0; c < in.channels; ++c) {
    for (int v = 0; v < 256; ++v) half_table[c][v] = FloatToHalf(table[c][v]);
  }
  Relayout(in, static_cast<uint16_t*>(dst), [&](int c, uint8_t v) { return half_table[c][v]; });
  return Status::OK();
}

}  // namespace kiln::image
