#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::image::internal {
namespace {

// Fixed-point precision of the weights: 32 bits minus 8 for the sample and
// 2 of headroom, as Pillow uses for 8-bit images.
constexpr int kPrecisionBits = 22;
constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

// Triangle (bilinear) filter with support 1.
inline double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Drops the fraction (the accumulator starts at one half, so this rounds)
// and saturates to 0..255.
inline uint8_t Clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// One output row of the horizontal pass for C channels.
template <int C>
void HorizontalRow(const uint8_t* src, const AxisTaps& taps, int n, uint8_t* dst) {
  for (int ox = 0; ox < n; ++ox) {
    const int32_t* k = &taps.weights[static_cast<size_t>(ox) * taps.ksize];
    const uint8_t* p = src + static_cast<size_t>(taps.first[ox]) * C;
    int32_t acc[C];
    for (int c = 0; c < C; ++c) acc[c] = kHalf;
    for (int i = 0; i < taps.count[ox]; ++i) {
      for (int c = 0; c < C; ++c) acc[c] += p[i * C + c] * k[i];
    }
    for (int c = 0; c < C; ++c) dst[ox * C + c] = Clip8(acc[c]);
  }
}

void HorizontalPass(const uint8_t* in, int in_w, int channels, int row_begin, int row_end,
                    const AxisTaps& taps, int n, uint8_t* out) {
  const size_t in_stride = static_cast<size_t>(in_w) * channels;
  const size_t out_stride = static_cast<size_t>(n) * channels;
  for (int y = row_begin; y < row_end; ++y) {
    const uint8_t* src = in + y * in_stride;
    uint8_t* dst = out + (y - row_begin) * out_stride;
    switch (channels) {
      case 1:
        HorizontalRow<1>(src, taps, n, dst);
        break;
      case 2:
        HorizontalRow<2>(src, taps, n, dst);
        break;
      case 3:
        HorizontalRow<3>(src, taps, n, dst);
        break;
      default:
        HorizontalRow<4>(src, taps, n, dst);
        break;
    }
  }
}

}  // namespace

AxisTaps ComputeAxisTaps(int in_size, double in0, double in1, int out_size, int begin, int end) {
  AxisTaps taps;
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filter_scale;  // the triangle's support is 1
  taps.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int n = end - begin;
  taps.first.resize(n);
  taps.count.resize(n);
  taps.weights.assign(static_cast<size_t>(n) * taps.ksize, 0);
  std::vector<double> w(taps.ksize);
  const double inv_filter_scale = 1.0 / filter_scale;
  for (int i = 0; i < n; ++i) {
    const double center = in0 + (begin + i + 0.5) * scale;
    // Window bounds rounded as (int)(v + 0.5), then clamped to the image.
    int lo = static_cast<int>(center - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = static_cast<int>(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    int count = hi - lo;
    if (count > taps.ksize) count = taps.ksize;
    double total = 0.0;
    for (int x = 0; x < count; ++x) {
      w[x] = Triangle((x + lo - center + 0.5) * inv_filter_scale);
      total += w[x];
    }
    int32_t* k = &taps.weights[static_cast<size_t>(i) * taps.ksize];
    for (int x = 0; x < count; ++x) {
      const double v = total != 0.0 ? w[x] / total : w[x];
      const double fixed = v * (1 << kPrecisionBits);
      k[x] = static_cast<int32_t>(v < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps.first[i] = lo;
    taps.count[i] = count;
  }
  return taps;
}

void ResampleRegion(const uint8_t* in, int in_w, int in_h, int channels, double box_w, double box_h,
                    int out_w, int out_h, int x0, int y0, int region_w, int region_h, uint8_t* dst,
                    size_t dst_stride) {
  if (region_w <= 0 || region_h <= 0) return;
  const bool need_horizontal = out_w != in_w || box_w != in_w;
  const bool need_vertical = out_h != in_h || box_h != in_h;
  const size_t row_bytes = static_cast<size_t>(region_w) * channels;

  // Rows of the input the vertical pass reads.
  AxisTaps vtaps;
  int row_begin = y0, row_end = y0 + region_h;
  if (need_vertical) {
    vtaps = ComputeAxisTaps(in_h, 0.0, box_h, out_h, y0, y0 + region_h);
    row_begin = vtaps.first.front();
    row_end = vtaps.first.back() + vtaps.count.back();
  }

  // Horizontal pass (or a plain column window) into an 8-bit intermediate.
  std::vector<uint8_t> temp;
  const uint8_t* mid;
  size_t mid_stride;
  if (need_horizontal) {
    AxisTaps htaps = ComputeAxisTaps(in_w, 0.0, box_w, out_w, x0, x0 + region_w);
    temp.resize(static_cast<size_t>(row_end - row_begin) * row_bytes);
    HorizontalPass(in, in_w, channels, row_begin, row_end, htaps, region_w, temp.data());
    mid = temp.data();
    mid_stride = row_bytes;
  } else {
    mid_stride = static_cast<size_t>(in_w) * channels;
    mid = in + row_begin * mid_stride + static_cast<size_t>(x0) * channels;
  }

  if (!need_vertical) {
    for (int y = 0; y < region_h; ++y) {
      std::memcpy(dst + y * dst_stride, mid + (y0 + y - row_begin) * mid_stride, row_bytes);
    }
    return;
  }
  // Vertical pass: accumulate whole rows so the inner loop vectorises.
  std::vector<int32_t> acc(row_bytes);
  for (int y = 0; y < region_h; ++y) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* k = &vtaps.weights[static_cast<size_t>(y) * vtaps.ksize];
    for (int i = 0; i < vtaps.count[y]; ++i) {
      const uint8_t* src = mid + (vtaps.first[y] + i - row_begin) * mid_stride;
      const int32_t weight = k[i];
      for (size_t j = 0; j < row_bytes; ++j) acc[j] += src[j] * weight;
    }
    uint8_t* out = dst + y * dst_stride;
    for (size_t j = 0; j < row_bytes; ++j) out[j] = Clip8(acc[j]);
  }
}

}  // namespace kiln::image::internal
