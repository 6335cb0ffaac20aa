#include "pixels/resample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "pixels/resample_kernels.h"
#include "pixels/simd.h"

namespace kiln::pixels {
namespace {

// Triangle (bilinear) filter with support 1.
inline double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// The fastest kernels ResampleRegion may use (KernelLevel); tests lower it.
std::atomic<int> g_max_level{kKernelsAvx512};

bool Allowed(int level) { return g_max_level.load(std::memory_order_relaxed) >= level; }

// One output row of the horizontal pass for C channels.
template <int C>
void HorizontalRow(const uint8_t* src, int, const AxisTaps& taps, int n, uint8_t* dst) {
  for (int ox = 0; ox < n; ++ox) HorizontalPixel<C>(src, taps, ox, dst);
}

RowFn HorizontalKernel(int channels) {
#ifdef KILN_X86_SIMD
  if (CpuSimd().sse41 && Allowed(kKernelsSse41) && (channels == 3 || channels == 4))
    return Sse41Row(channels);
#endif
  switch (channels) {
    case 1: return HorizontalRow<1>;
    case 2: return HorizontalRow<2>;
    case 3: return HorizontalRow<3>;
    default: return HorizontalRow<4>;
  }
}

// Which horizontal kernel a pass uses, and its prepared weights: chosen
// once per pass, not per row.
struct HorizontalPlan {
  enum Kind { kRow, kMadd, kPlane, kPlane512 } kind = kRow;
  int pairs = 0;
  RowFn row = nullptr;  // kRow's kernel
};

HorizontalPlan PlanHorizontal(const AxisTaps& taps, int n, int channels, ResampleScratch* ws) {
  HorizontalPlan plan;
  plan.row = HorizontalKernel(channels);
#ifdef KILN_X86_SIMD
  if (!CpuSimd().avx2 || !Allowed(kKernelsAvx2)) return plan;
  const int max_count =
      taps.count.empty() ? 0 : *std::max_element(taps.count.begin(), taps.count.end());
  if ((channels == 3 || channels == 4) && max_count <= 6) {
    plan.kind = HorizontalPlan::kMadd;
    plan.pairs = max_count <= 4 ? 2 : 3;
    MaddWeights(taps, n, channels, plan.pairs, &ws->madd);
  } else if (channels == 1) {
    if (CpuSimd().avx512bw_vbmi && Allowed(kKernelsAvx512)) {
      plan.pairs = PlanePairs512(taps, n, &ws->plane_bases, &ws->plane_pairs512);
      if (plan.pairs > 0) {
        plan.kind = HorizontalPlan::kPlane512;
        return plan;
      }
    }
    plan.pairs = PlanePairs(taps, n, &ws->plane_bases, &ws->plane_pairs);
    if (plan.pairs > 0) plan.kind = HorizontalPlan::kPlane;
  }
#else
  (void)taps, (void)n, (void)channels, (void)ws;
#endif
  return plan;
}

// Rows [row_begin, row_end) of `in` (rows in_stride bytes apart, in_w
// pixels of `channels`) resampled along x into `out` (rows of n pixels,
// out_stride bytes apart), as `plan` says.
void HorizontalPass(const uint8_t* in, size_t in_stride, int in_w, int channels, int row_begin,
                    int row_end, const AxisTaps& taps, const HorizontalPlan& plan,
                    const ResampleScratch& ws, int n, uint8_t* out, size_t out_stride) {
  for (int y = row_begin; y < row_end; ++y) {
    const uint8_t* src = in + y * in_stride;
    uint8_t* dst = out + (y - row_begin) * out_stride;
#ifdef KILN_X86_SIMD
    if (plan.kind == HorizontalPlan::kMadd) {
      MaddRowAvx2(channels, plan.pairs, src, in_w, taps, ws.madd.data(), n, dst);
      continue;
    }
    if (plan.kind == HorizontalPlan::kPlane512) {
      PlaneRowAvx512(plan.pairs, src, in_w, ws.plane_bases.data(), ws.plane_pairs512.data(), n,
                     dst);
      continue;
    }
    if (plan.kind == HorizontalPlan::kPlane) {
      PlaneRowAvx2(plan.pairs, src, in_w, ws.plane_bases.data(), ws.plane_pairs.data(), n, dst);
      continue;
    }
#endif
    plan.row(src, in_w, taps, n, dst);
  }
}

// Reverses the order of the output positions of `taps` (a mirrored region).
void MirrorTaps(AxisTaps* taps) {
  const size_t n = taps->first.size(), k = static_cast<size_t>(taps->ksize);
  std::reverse(taps->first.begin(), taps->first.end());
  std::reverse(taps->count.begin(), taps->count.end());
  for (size_t i = 0; i < n / 2; ++i)
    std::swap_ranges(taps->weights.begin() + i * k, taps->weights.begin() + (i + 1) * k,
                     taps->weights.begin() + (n - 1 - i) * k);
}

}  // namespace

AxisTaps ComputeAxisTaps(int in_size, double in0, double in1, int out_size, int begin, int end) {
  AxisTaps taps;
  ComputeAxisTaps(in_size, in0, in1, out_size, begin, end, &taps);
  return taps;
}

void ComputeAxisTaps(int in_size, double in0, double in1, int out_size, int begin, int end,
                     AxisTaps* out) {
  AxisTaps& taps = *out;
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filter_scale;  // the triangle's support is 1
  taps.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int n = end - begin;
  taps.first.resize(n);
  taps.count.resize(n);
  taps.weights.assign(static_cast<size_t>(n) * taps.ksize, 0);
  taps.work.resize(taps.ksize);
  std::vector<double>& w = taps.work;
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
}

namespace {

// Which vertical kernel a pass uses (chosen once per call).
struct VerticalKernels {
  bool avx2 = false, avx512 = false;
};

VerticalKernels ChooseVertical(const AxisTaps& vtaps) {
  VerticalKernels k;
#ifdef KILN_X86_SIMD
  k.avx2 = CpuSimd().avx2 && Allowed(kKernelsAvx2);
  k.avx512 = CpuSimd().avx512bw_vbmi && Allowed(kKernelsAvx512) && vtaps.ksize <= 16;
#else
  (void)vtaps;
#endif
  return k;
}

// The vertical pass: output row y (0 <= y < rows) of row_bytes bytes at
// out + y * out_stride, from the input rows vtaps names, which are
// row_begin + i rows of `mid` (mid_stride bytes apart) for tap row i.
void VerticalPass(const uint8_t* mid, size_t mid_stride, int row_begin, const AxisTaps& vtaps,
                  const VerticalKernels& vk, int rows, size_t row_bytes, uint8_t* out,
                  size_t out_stride, ResampleScratch* ws) {
#ifdef KILN_X86_SIMD
  if (vk.avx2) {
    std::vector<const uint8_t*>& in_rows = ws->rows;
    in_rows.resize(vtaps.ksize);
    for (int y = 0; y < rows; ++y) {
      for (int i = 0; i < vtaps.count[y]; ++i)
        in_rows[i] = mid + (vtaps.first[y] + i - row_begin) * mid_stride;
      const int32_t* k = &vtaps.weights[static_cast<size_t>(y) * vtaps.ksize];
      if (vk.avx512) {
        VerticalRowAvx512(in_rows.data(), k, vtaps.count[y], row_bytes, out + y * out_stride);
      } else {
        VerticalRowAvx2(in_rows.data(), k, vtaps.count[y], row_bytes, out + y * out_stride);
      }
    }
    return;
  }
#else
  (void)vk;
#endif
  // Portable: accumulate whole rows so the inner loop vectorises.
  std::vector<int32_t>& acc = ws->acc;
  acc.resize(row_bytes);
  for (int y = 0; y < rows; ++y) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* k = &vtaps.weights[static_cast<size_t>(y) * vtaps.ksize];
    for (int i = 0; i < vtaps.count[y]; ++i) {
      const uint8_t* src = mid + (vtaps.first[y] + i - row_begin) * mid_stride;
      const int32_t weight = k[i];
      for (size_t j = 0; j < row_bytes; ++j) acc[j] += src[j] * weight;
    }
    uint8_t* o = out + y * out_stride;
    for (size_t j = 0; j < row_bytes; ++j) o[j] = Clip8(acc[j]);
  }
}

// ResampleRegion and ResamplePlanes: `planes` images of in_w x in_h pixels
// of `channels` bytes (image p at in + p * in_plane, rows in_stride apart),
// each region written at dst + p * dst_plane (rows dst_stride apart),
// mirrored along x when `flip`. The taps are computed once for all planes.
void Resample(const uint8_t* in, size_t in_stride, size_t in_plane, int planes, int in_w, int in_h,
              int channels, double box_w, double box_h, int out_w, int out_h, int x0, int y0,
              int region_w, int region_h, bool flip, uint8_t* dst, size_t dst_stride,
              size_t dst_plane, ResampleScratch* scratch, double box_x0 = 0,
              double box_y0 = 0) {
  if (region_w <= 0 || region_h <= 0) return;
  ResampleScratch local;
  ResampleScratch& ws = scratch != nullptr ? *scratch : local;
  // A mirrored region takes the horizontal pass even at scale 1: its taps
  // are then the identity (one weight of 1.0), in reverse order.
  const bool need_horizontal = flip || out_w != in_w || box_w != in_w || box_x0 != 0;
  const bool need_vertical = out_h != in_h || box_h != in_h || box_y0 != 0;
  const size_t row_bytes = static_cast<size_t>(region_w) * channels;

  // Rows of the input the vertical pass reads.
  AxisTaps& vtaps = ws.vertical;
  int row_begin = y0, row_end = y0 + region_h;
  if (need_vertical) {
    ComputeAxisTaps(in_h, box_y0, box_y0 + box_h, out_h, y0, y0 + region_h, &vtaps);
    row_begin = vtaps.first.front();
    row_end = vtaps.first.back() + vtaps.count.back();
  }
  AxisTaps& htaps = ws.horizontal;
  HorizontalPlan hplan;
  if (need_horizontal) {
    ComputeAxisTaps(in_w, box_x0, box_x0 + box_w, out_w, x0, x0 + region_w, &htaps);
    if (flip) MirrorTaps(&htaps);
    hplan = PlanHorizontal(htaps, region_w, channels, &ws);
  }
  const VerticalKernels vk = ChooseVertical(vtaps);

  // Pillow 13 runs the vertical pass first when the height shrinks by more
  // than twice what the width does (Resample.c, ImagingResampleInner); the
  // order changes the rounding of the 8-bit intermediate, so kiln follows it
  // to stay byte-exact with the Pillow users have (Pillow 12 and older
  // always went horizontal first: PillowVerticalFirst says which).
  if (need_horizontal && need_vertical && PillowVerticalFirst(in_w, in_h, out_w, out_h)) {
    // The columns the horizontal taps read; the vertical pass makes only
    // those, for the region's rows, and the horizontal pass reads them.
    int col_begin = in_w, col_end = 0;
    for (size_t i = 0; i < htaps.first.size(); ++i) {
      col_begin = std::min(col_begin, htaps.first[i]);
      col_end = std::max(col_end, htaps.first[i] + htaps.count[i]);
    }
    for (int& f : htaps.first) f -= col_begin;
    hplan = PlanHorizontal(htaps, region_w, channels, &ws);
    const int mid_w = col_end - col_begin;
    const size_t mid_bytes = static_cast<size_t>(mid_w) * channels;
    for (int p = 0; p < planes; ++p) {
      const uint8_t* pin = in + p * in_plane + static_cast<size_t>(col_begin) * channels;
      ws.temp.resize(static_cast<size_t>(region_h) * mid_bytes);
      VerticalPass(pin, in_stride, 0, vtaps, vk, region_h, mid_bytes, ws.temp.data(), mid_bytes,
                   &ws);
      HorizontalPass(ws.temp.data(), mid_bytes, mid_w, channels, 0, region_h, htaps, hplan, ws,
                     region_w, dst + p * dst_plane, dst_stride);
    }
    return;
  }

  for (int p = 0; p < planes; ++p) {
    const uint8_t* pin = in + p * in_plane;
    uint8_t* pdst = dst + p * dst_plane;
    // Horizontal pass (or a plain column window) into an 8-bit intermediate.
    std::vector<uint8_t>& temp = ws.temp;
    const uint8_t* mid;
    size_t mid_stride;
    if (need_horizontal) {
      temp.resize(static_cast<size_t>(row_end - row_begin) * row_bytes);
      HorizontalPass(pin, in_stride, in_w, channels, row_begin, row_end, htaps, hplan, ws, region_w,
                     temp.data(), row_bytes);
      mid = temp.data();
      mid_stride = row_bytes;
    } else {
      mid_stride = in_stride;
      mid = pin + row_begin * mid_stride + static_cast<size_t>(x0) * channels;
    }

    if (!need_vertical) {
      for (int y = 0; y < region_h; ++y) {
        std::memcpy(pdst + y * dst_stride, mid + (y0 + y - row_begin) * mid_stride, row_bytes);
      }
      continue;
    }
    VerticalPass(mid, mid_stride, row_begin, vtaps, vk, region_h, row_bytes, pdst, dst_stride,
                 &ws);
  }
}

}  // namespace

void ResampleRegion(const uint8_t* in, int in_w, int in_h, int channels, double box_w, double box_h,
                    int out_w, int out_h, int x0, int y0, int region_w, int region_h, uint8_t* dst,
                    size_t dst_stride, ResampleScratch* scratch) {
  Resample(in, static_cast<size_t>(in_w) * channels, 0, 1, in_w, in_h, channels, box_w, box_h,
           out_w, out_h, x0, y0, region_w, region_h, false, dst, dst_stride, 0, scratch);
}

void ResamplePlanes(const uint8_t* in, size_t in_stride, size_t in_plane, int planes, int in_w,
                    int in_h, double box_w, double box_h, int out_w, int out_h, int x0, int y0,
                    int region_w, int region_h, bool flip, uint8_t* dst, size_t dst_stride,
                    size_t dst_plane, ResampleScratch* scratch, double box_x0, double box_y0) {
  Resample(in, in_stride, in_plane, planes, in_w, in_h, 1, box_w, box_h, out_w, out_h, x0, y0,
           region_w, region_h, flip, dst, dst_stride, dst_plane, scratch, box_x0, box_y0);
}

bool PillowVerticalFirst(int in_w, int in_h, int out_w, int out_h) {
  const int shrink_h = in_h - out_h, shrink_w = in_w - out_w;
  return shrink_h > 0 && shrink_h > shrink_w * 2;
}

void UseKernelsUpTo(KernelLevel level) { g_max_level.store(level); }

}  // namespace kiln::pixels
