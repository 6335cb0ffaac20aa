// kiln::image transforms: torchvision geometry, PIL resampling, CHW output.
#include "kiln/image/transform.h"

#include <algorithm>
#include <cstring>

#include "resample.h"

namespace kiln::image {
namespace {

std::string Size(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

// torchvision CenterCrop's offset of a `crop`-long window in a `size`-long
// axis: int(round((size - crop) / 2.0)) with Python's round-half-to-even, or,
// when the crop is larger, minus the left/top zero padding (crop - size) // 2.
int CropOffset(int size, int crop) {
  if (crop > size) return -((crop - size) / 2);
  const int d = size - crop;
  const int q = d / 2;
  if (d % 2 == 0) return q;
  return q % 2 == 0 ? q : q + 1;  // q + 0.5 rounds to the even neighbour
}

Status CheckSpec(const ResizeSpec& s) {
  if (s.resize_shorter < 0 || s.crop < 0 || s.squash_w < 0 || s.squash_h < 0) {
    return Status::InvalidArgument("ResizeSpec: sizes must not be negative");
  }
  if ((s.squash_w > 0) != (s.squash_h > 0)) {
    return Status::InvalidArgument("ResizeSpec: give both squash_w and squash_h, or neither");
  }
  if (s.squash_w > 0 && s.resize_shorter > 0) {
    return Status::InvalidArgument("ResizeSpec: resize_shorter and squash_w/h exclude each other");
  }
  if (s.max_side < 0 || (s.max_side > 0 && s.squash_w > 0))
    return Status::InvalidArgument("ResizeSpec: max_side must be positive and excludes squash");
  if (s.max_side > 0 && s.resize_shorter >= s.max_side)
    return Status::InvalidArgument("ResizeSpec: max_side " + std::to_string(s.max_side) +
                                   " must be larger than the shorter side's " +
                                   std::to_string(s.resize_shorter));
  return Status::OK();
}

// Builds a lookup table per channel: value v of channel c -> normalised float.
void BuildTable(const float* mean, const float* std, int channels, float table[][256]) {
  for (int c = 0; c < channels; ++c) {
    const float m = mean != nullptr ? mean[c] : 0.0f;
    const float s = std != nullptr ? std[c] : 1.0f;
    for (int v = 0; v < 256; ++v) {
      // Same float32 operations as ToTensor (div 255) then Normalize.
      const float x = static_cast<float>(v) / 255.0f;
      table[c][v] = (x - m) / s;
    }
  }
}

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

Status PlanResize(int in_w, int in_h, const ResizeSpec& spec, int* resized_w, int* resized_h) {
  KILN_RETURN_IF_ERROR(CheckSpec(spec));
  if (in_w <= 0 || in_h <= 0) {
    return Status::InvalidArgument("PlanResize: invalid input size " + Size(in_w, in_h));
  }
  if (spec.squash_w > 0) {
    *resized_w = spec.squash_w;
    *resized_h = spec.squash_h;
  } else if (spec.resize_shorter > 0) {
    // torchvision: new_long = int(S * long / short), a true division in
    // double then truncation.
    const bool w_short = in_w <= in_h;
    const int shorter = w_short ? in_w : in_h;
    const int longer = w_short ? in_h : in_w;
    const double ratio =
        static_cast<double>(int64_t{spec.resize_shorter} * longer) / static_cast<double>(shorter);
    const int new_long = static_cast<int>(ratio);
    *resized_w = w_short ? spec.resize_shorter : new_long;
    *resized_h = w_short ? new_long : spec.resize_shorter;
  } else {
    *resized_w = in_w;
    *resized_h = in_h;
  }
  if (spec.max_side > 0 && std::max(*resized_w, *resized_h) > spec.max_side) {
    // torchvision: new_short = int(max_size * new_short / new_long), the
    // product exact, a true division, then truncation.
    const bool w_short = *resized_w <= *resized_h;
    const int shorter = w_short ? *resized_w : *resized_h;
    const int longer = w_short ? *resized_h : *resized_w;
    const int new_short = std::max(
        1, static_cast<int>(static_cast<double>(int64_t{spec.max_side} * shorter) / longer));
    *resized_w = w_short ? new_short : spec.max_side;
    *resized_h = w_short ? spec.max_side : new_short;
  }
  return Status::OK();
}

Status PlanGeometry(int in_w, int in_h, const ResizeSpec& spec, int* out_w, int* out_h) {
  KILN_RETURN_IF_ERROR(PlanResize(in_w, in_h, spec, out_w, out_h));
  if (spec.crop > 0) *out_w = *out_h = spec.crop;
  return Status::OK();
}

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
  internal::ResampleRegion(in.pixels.data(), in.width, in.height, in.channels, box_w, box_h, rw, rh,
                           x_begin, y_begin, x_end - x_begin, y_end - y_begin, dst, stride);
  return Status::OK();
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7FFFFFFFu;
  if (bits >= 0x47800000u) {                        // |value| >= 65536, infinity or NaN
    if (bits > 0x7F800000u) return sign | 0x7E00u;  // quiet NaN
    return sign | 0x7C00u;
  }
  if (bits < 0x38800000u) {  // below 2^-14: a half subnormal or zero
    // Adding 0.5 shifts the value's bits so that the float unit itself
    // rounds the 2^-24 multiples to nearest even; the low bits are the half.
    float shifted;
    std::memcpy(&shifted, &bits, 4);
    shifted += 0.5f;
    uint32_t s;
    std::memcpy(&s, &shifted, 4);
    return sign | static_cast<uint16_t>(s - 0x3F000000u);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped
  // mantissa bits to nearest, ties to the even result. A carry out of the
  // mantissa correctly bumps the exponent (65520 -> infinity).
  const uint32_t odd = (bits >> 13) & 1u;
  bits += 0xC8000000u + 0x0FFFu + odd;  // 0xC8000000 = (15 - 127) << 23 mod 2^32
  return sign | static_cast<uint16_t>(bits >> 13);
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
  BuildTable(mean, std, in.channels, table);
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
