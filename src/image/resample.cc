#include "resample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// The SIMD kernels below exist only for x86-64 and are chosen at run time
// by what the CPU supports; they give exactly the portable code's bytes
// (the same integer arithmetic, in the same order of rounding).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_RESAMPLE_X86 1
#endif

struct Kernels {
  bool sse41 = false;
  bool avx2 = false;
};

Kernels Detect() {
  Kernels k;
#ifdef KILN_RESAMPLE_X86
  __builtin_cpu_init();
  k.sse41 = __builtin_cpu_supports("sse4.1");
  k.avx2 = __builtin_cpu_supports("avx2");
#endif
  return k;
}

const Kernels& Cpu() {
  static const Kernels k = Detect();
  return k;
}

// The fastest kernels ResampleRegion may use (KernelLevel); tests lower it.
std::atomic<int> g_max_level{kKernelsAvx2};

bool Allowed(int level) { return g_max_level.load(std::memory_order_relaxed) >= level; }

// One output pixel of the horizontal pass, C channels.
template <int C>
inline void HorizontalPixel(const uint8_t* src, const AxisTaps& taps, int ox, uint8_t* dst) {
  const int32_t* k = &taps.weights[static_cast<size_t>(ox) * taps.ksize];
  const uint8_t* p = src + static_cast<size_t>(taps.first[ox]) * C;
  int32_t acc[C];
  for (int c = 0; c < C; ++c) acc[c] = kHalf;
  for (int i = 0; i < taps.count[ox]; ++i) {
    for (int c = 0; c < C; ++c) acc[c] += p[i * C + c] * k[i];
  }
  for (int c = 0; c < C; ++c) dst[ox * C + c] = Clip8(acc[c]);
}

// One output row of the horizontal pass for C channels.
template <int C>
void HorizontalRow(const uint8_t* src, int, const AxisTaps& taps, int n, uint8_t* dst) {
  for (int ox = 0; ox < n; ++ox) HorizontalPixel<C>(src, taps, ox, dst);
}

#ifdef KILN_RESAMPLE_X86
// SSE4.1, 3 or 4 channels: one output pixel is one vector of four int32
// lanes, one tap per step. A tap is read as 4 bytes, which for 3 channels
// is one byte past the pixel, so pixels whose window ends at the last
// input pixel of the row take the portable path.
template <int C>
__attribute__((target("sse4.1"))) void HorizontalRowSse41(const uint8_t* src, int in_w,
                                                           const AxisTaps& taps, int n,
                                                           uint8_t* dst) {
  static_assert(C == 3 || C == 4, "pixels of 3 or 4 bytes");
  const int safe_end = C == 4 ? in_w : in_w - 1;
  const __m128i half = _mm_set1_epi32(kHalf);
  for (int ox = 0; ox < n; ++ox) {
    const int first = taps.first[ox], count = taps.count[ox];
    if (first + count > safe_end) {
      HorizontalPixel<C>(src, taps, ox, dst);
      continue;
    }
    const int32_t* k = &taps.weights[static_cast<size_t>(ox) * taps.ksize];
    const uint8_t* p = src + static_cast<size_t>(first) * C;
    __m128i acc = half;
    for (int i = 0; i < count; ++i) {
      int32_t bytes;
      std::memcpy(&bytes, p + i * C, sizeof(bytes));
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(bytes));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[i])));
    }
    // >> 22, then saturate to int16 and to uint8: Clip8 on each lane.
    const __m128i v = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i b = _mm_packus_epi16(_mm_packs_epi32(v, v), _mm_setzero_si128());
    const int32_t out = _mm_cvtsi128_si32(b);
    std::memcpy(dst + ox * C, &out, C);
  }
}

// AVX2 vertical pass of one output row: 16 bytes at a time, all taps summed
// in registers.
__attribute__((target("avx2"))) void VerticalRowAvx2(const uint8_t* const* rows,
                                                     const int32_t* k, int count,
                                                     size_t row_bytes, uint8_t* out) {
  size_t j = 0;
  const __m256i half = _mm256_set1_epi32(kHalf);
  for (; j + 16 <= row_bytes; j += 16) {
    __m256i lo = half, hi = half;
    for (int i = 0; i < count; ++i) {
      const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + j));
      const __m256i w = _mm256_set1_epi32(k[i]);
      lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), w));
      hi = _mm256_add_epi32(
          hi, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), w));
    }
    lo = _mm256_srai_epi32(lo, kPrecisionBits);
    hi = _mm256_srai_epi32(hi, kPrecisionBits);
    // packs/packus work per 128-bit lane: put the lanes back in order.
    __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
    const __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), b);
  }
  for (; j < row_bytes; ++j) {
    int32_t acc = kHalf;
    for (int i = 0; i < count; ++i) acc += rows[i][j] * k[i];
    out[j] = Clip8(acc);
  }
}

// The vpshufb controls of HorizontalRowMaddAvx2 for C channels, made once:
// int16 lane c of each 64-bit group = (byte of tap t, channel c; tap t+1),
// taps 0,1 (bytes[0]) and 2,3 (bytes[1]) of a window, zero-extended; the
// same for both 128-bit halves, and zeros for a missing fourth channel.
struct MaddControl {
  alignas(32) int8_t bytes[2][32];
};

template <int C>
const MaddControl& MaddShuffleControl() {
  static const MaddControl control = [] {
    MaddControl m;
    for (int pair = 0; pair < 2; ++pair)
      for (int lane = 0; lane < 2; ++lane)
        for (int c = 0; c < 4; ++c) {
          int8_t* q = &m.bytes[pair][lane * 16 + c * 4];
          const int t = pair * 2;
          const bool real = c < C;
          q[0] = real ? static_cast<int8_t>(t * C + c) : int8_t(-128);
          q[1] = int8_t(-128);
          q[2] = real ? static_cast<int8_t>((t + 1) * C + c) : int8_t(-128);
          q[3] = int8_t(-128);
        }
    return m;
  }();
  return control;
}

// AVX2 horizontal pass with 16-bit multiply-adds, 3 or 4 channels, two
// output pixels per step (one in each 128-bit half), for windows of at most
// 2 * kPairs taps. A window's bytes are loaded once and shuffled into int16
// pairs (tap 2p, tap 2p+1) per channel, so one vpmaddwd does two taps of
// every channel. The 22-bit weights do not fit int16, so each is split as
// k = kh * 2^11 + kl (both < 2^11 + 1; the weights are never negative):
// acc = half + (sum px*kh) * 2^11 + sum px*kl, the same integer as the
// portable sum, so the bytes are the same. `w` comes from MaddWeights.
// Pixels whose window would read past the row take the portable path.
template <int C, int kPairs>
__attribute__((target("avx2"))) void HorizontalRowMaddAvx2(const uint8_t* src, int in_w,
                                                           const AxisTaps& taps, const int16_t* w,
                                                           int n, uint8_t* dst) {
  static_assert(C == 3 || C == 4, "pixels of 3 or 4 bytes");
  static_assert(kPairs == 2 || kPairs == 3, "4 or 6 taps");
  // Bytes read from a window's start: 16, and 16 more at tap 4 for 6 taps.
  constexpr size_t kReach = kPairs == 2 ? 16 : 4 * C + 16;
  const size_t row_bytes = static_cast<size_t>(in_w) * C;
  const MaddControl& control = MaddShuffleControl<C>();
  const __m256i taps01 = _mm256_load_si256(reinterpret_cast<const __m256i*>(control.bytes[0]));
  const __m256i taps23 = _mm256_load_si256(reinterpret_cast<const __m256i*>(control.bytes[1]));
  const __m256i half = _mm256_set1_epi32(kHalf);
  constexpr int kBlock = kPairs * 2 * 16;  // int16 weights per pair of output pixels
  int ox = 0;
  for (; ox + 1 < n; ox += 2) {
    const size_t fa = static_cast<size_t>(taps.first[ox]) * C;
    const size_t fb = static_cast<size_t>(taps.first[ox + 1]) * C;
    if (fa + kReach > row_bytes || fb + kReach > row_bytes) {
      HorizontalPixel<C>(src, taps, ox, dst);
      HorizontalPixel<C>(src, taps, ox + 1, dst);
      continue;
    }
    const int16_t* pw = w + static_cast<size_t>(ox / 2) * kBlock;
#define KILN_WV(i) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + (i) * 16))
    const __m256i px = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fa))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fb)), 1);
    const __m256i v0 = _mm256_shuffle_epi8(px, taps01);
    const __m256i v1 = _mm256_shuffle_epi8(px, taps23);
    __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(v0, KILN_WV(0)), _mm256_madd_epi16(v1, KILN_WV(2)));
    __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(v0, KILN_WV(1)), _mm256_madd_epi16(v1, KILN_WV(3)));
    if (kPairs == 3) {
      const __m256i px4 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fa + 4 * C))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fb + 4 * C)), 1);
      const __m256i v2 = _mm256_shuffle_epi8(px4, taps01);
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(v2, KILN_WV(4)));
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(v2, KILN_WV(5)));
    }
#undef KILN_WV
    const __m256i acc = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo), half);
    // >> 22, then saturate to int16 and to uint8: Clip8 on each lane.
    const __m256i v = _mm256_srai_epi32(acc, kPrecisionBits);
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b8 = _mm_packus_epi16(w16, _mm_setzero_si128());
    const int32_t out_a = _mm_cvtsi128_si32(b8), out_b = _mm_extract_epi32(b8, 1);
    std::memcpy(dst + static_cast<size_t>(ox) * C, &out_a, C);
    std::memcpy(dst + static_cast<size_t>(ox + 1) * C, &out_b, C);
  }
  for (; ox < n; ++ox) HorizontalPixel<C>(src, taps, ox, dst);
}

// The weights of HorizontalRowMaddAvx2 for `pairs` tap pairs: per pair of
// output pixels (A, B) and tap pair p, a block of kh then a block of kl,
// each 16 int16: A's (k[2p], k[2p+1]) for each of C channels (zeros for a
// missing fourth), then B's. Taps past a pixel's count weigh 0.
void MaddWeights(const AxisTaps& taps, int n, int channels, int pairs, std::vector<int16_t>* out) {
  std::vector<int16_t>& w = *out;
  w.assign(static_cast<size_t>((n + 1) / 2) * pairs * 2 * 16, 0);
  for (int ox = 0; ox < n; ++ox) {
    auto k = [&](int t) -> int32_t {
      return t < taps.count[ox] ? taps.weights[static_cast<size_t>(ox) * taps.ksize + t] : 0;
    };
    for (int p = 0; p < pairs; ++p)
      for (int part = 0; part < 2; ++part) {  // 0: kh = k >> 11, 1: kl = k & 2047
        int16_t* q = &w[((static_cast<size_t>(ox / 2) * pairs + p) * 2 + part) * 16 + (ox % 2) * 8];
        for (int c = 0; c < channels; ++c)
          for (int j = 0; j < 2; ++j) {
            const int32_t v = k(2 * p + j);
            q[c * 2 + j] = static_cast<int16_t>(part == 0 ? v >> 11 : v & 2047);
          }
      }
  }
}
#endif

using RowFn = void (*)(const uint8_t*, int, const AxisTaps&, int, uint8_t*);

RowFn HorizontalKernel(int channels) {
#ifdef KILN_RESAMPLE_X86
  if (Cpu().sse41 && Allowed(kKernelsSse41)) {
    if (channels == 3) return HorizontalRowSse41<3>;
    if (channels == 4) return HorizontalRowSse41<4>;
  }
#endif
  switch (channels) {
    case 1: return HorizontalRow<1>;
    case 2: return HorizontalRow<2>;
    case 3: return HorizontalRow<3>;
    default: return HorizontalRow<4>;
  }
}

void HorizontalPass(const uint8_t* in, int in_w, int channels, int row_begin, int row_end,
                    const AxisTaps& taps, int n, uint8_t* out, std::vector<int16_t>* madd) {
  const size_t in_stride = static_cast<size_t>(in_w) * channels;
  const size_t out_stride = static_cast<size_t>(n) * channels;
#ifdef KILN_RESAMPLE_X86
  const int max_count = taps.count.empty() ? 0 : *std::max_element(taps.count.begin(), taps.count.end());
  if (Cpu().avx2 && Allowed(kKernelsAvx2) && (channels == 3 || channels == 4) && max_count <= 6) {
    const int pairs = max_count <= 4 ? 2 : 3;
    MaddWeights(taps, n, channels, pairs, madd);
    const std::vector<int16_t>& w = *madd;
    for (int y = row_begin; y < row_end; ++y) {
      const uint8_t* src = in + y * in_stride;
      uint8_t* dst = out + (y - row_begin) * out_stride;
      if (channels == 3 && pairs == 2) HorizontalRowMaddAvx2<3, 2>(src, in_w, taps, w.data(), n, dst);
      else if (channels == 3) HorizontalRowMaddAvx2<3, 3>(src, in_w, taps, w.data(), n, dst);
      else if (pairs == 2) HorizontalRowMaddAvx2<4, 2>(src, in_w, taps, w.data(), n, dst);
      else HorizontalRowMaddAvx2<4, 3>(src, in_w, taps, w.data(), n, dst);
    }
    return;
  }
#endif
  const RowFn row = HorizontalKernel(channels);
  for (int y = row_begin; y < row_end; ++y) {
    row(in + y * in_stride, in_w, taps, n, out + (y - row_begin) * out_stride);
  }
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

void ResampleRegion(const uint8_t* in, int in_w, int in_h, int channels, double box_w, double box_h,
                    int out_w, int out_h, int x0, int y0, int region_w, int region_h, uint8_t* dst,
                    size_t dst_stride, ResampleScratch* scratch) {
  if (region_w <= 0 || region_h <= 0) return;
  ResampleScratch local;
  ResampleScratch& ws = scratch != nullptr ? *scratch : local;
  const bool need_horizontal = out_w != in_w || box_w != in_w;
  const bool need_vertical = out_h != in_h || box_h != in_h;
  const size_t row_bytes = static_cast<size_t>(region_w) * channels;

  // Rows of the input the vertical pass reads.
  AxisTaps& vtaps = ws.vertical;
  int row_begin = y0, row_end = y0 + region_h;
  if (need_vertical) {
    ComputeAxisTaps(in_h, 0.0, box_h, out_h, y0, y0 + region_h, &vtaps);
    row_begin = vtaps.first.front();
    row_end = vtaps.first.back() + vtaps.count.back();
  }

  // Horizontal pass (or a plain column window) into an 8-bit intermediate.
  std::vector<uint8_t>& temp = ws.temp;
  const uint8_t* mid;
  size_t mid_stride;
  if (need_horizontal) {
    AxisTaps& htaps = ws.horizontal;
    ComputeAxisTaps(in_w, 0.0, box_w, out_w, x0, x0 + region_w, &htaps);
    temp.resize(static_cast<size_t>(row_end - row_begin) * row_bytes);
    HorizontalPass(in, in_w, channels, row_begin, row_end, htaps, region_w, temp.data(), &ws.madd);
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
  // Vertical pass.
#ifdef KILN_RESAMPLE_X86
  if (Cpu().avx2 && Allowed(kKernelsAvx2)) {
    std::vector<const uint8_t*>& rows = ws.rows;
    rows.resize(vtaps.ksize);
    for (int y = 0; y < region_h; ++y) {
      for (int i = 0; i < vtaps.count[y]; ++i)
        rows[i] = mid + (vtaps.first[y] + i - row_begin) * mid_stride;
      VerticalRowAvx2(rows.data(), &vtaps.weights[static_cast<size_t>(y) * vtaps.ksize],
                      vtaps.count[y], row_bytes, dst + y * dst_stride);
    }
    return;
  }
#endif
  // Portable: accumulate whole rows so the inner loop vectorises.
  std::vector<int32_t>& acc = ws.acc;
  acc.resize(row_bytes);
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

void UseKernelsUpTo(KernelLevel level) { g_max_level.store(level); }

}  // namespace kiln::image::internal
