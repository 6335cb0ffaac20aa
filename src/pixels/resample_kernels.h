// The resampler's fixed-point arithmetic and its x86 SIMD kernels
// (resample.cc chooses among them). Every kernel
// gives exactly the portable code's bytes: the same integer sums, rounded
// and saturated the same way.
#ifndef KILN_SRC_PIXELS_RESAMPLE_KERNELS_H_
#define KILN_SRC_PIXELS_RESAMPLE_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pixels/simd.h"
#include "pixels/resample.h"

namespace kiln::pixels {

// Fixed-point precision of the weights: 32 bits minus 8 for the sample and
// 2 of headroom, as Pillow uses for 8-bit images.
constexpr int kPrecisionBits = 22;
constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

// Drops the fraction (the accumulator starts at one half, so this rounds)
// and saturates to 0..255.
inline uint8_t Clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The SIMD kernels below exist only for x86-64 (KILN_X86_SIMD) and are
// chosen at run time by what the CPU supports; they give exactly the
// portable code's bytes (the same integer arithmetic, in the same order of
// rounding).

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

// One output row of the horizontal pass: a kernel of the signature the
// portable row (HorizontalRow<C> in resample.cc) has.
using RowFn = void (*)(const uint8_t*, int, const AxisTaps&, int, uint8_t*);

#ifdef KILN_X86_SIMD
// SSE4.1 horizontal row, 3 or 4 channels.
RowFn Sse41Row(int channels);

// AVX2 horizontal row with 16-bit multiply-adds, 3 or 4 channels, for
// windows of at most 2 * pairs taps (pairs 2 or 3); `w` from MaddWeights.
void MaddRowAvx2(int channels, int pairs, const uint8_t* src, int in_w, const AxisTaps& taps,
                 const int16_t* w, int n, uint8_t* dst);
// The weights of MaddRowAvx2 for `pairs` tap pairs.
void MaddWeights(const AxisTaps& taps, int n, int channels, int pairs, std::vector<int16_t>* out);

// One-channel horizontal rows (planes): eight outputs per AVX2 step,
// sixteen per AVX-512 step, planned by PlanePairs / PlanePairs512, which
// return the tap pairs per group (1..4), or 0 where some group's windows do
// not fit the kernel (16 / 32 input bytes, 8 taps).
int PlanePairs(const AxisTaps& taps, int n, std::vector<int>* bases,
               std::vector<PlaneTapPair>* out);
void PlaneRowAvx2(int pairs, const uint8_t* src, int in_w, const int* bases,
                  const PlaneTapPair* plan, int n, uint8_t* dst);
int PlanePairs512(const AxisTaps& taps, int n, std::vector<int>* bases,
                  std::vector<PlaneTapPair512>* out);
void PlaneRowAvx512(int pairs, const uint8_t* src, int in_w, const int* bases,
                    const PlaneTapPair512* plan, int n, uint8_t* dst);

// Vertical pass of one output row of row_bytes bytes: `count` input rows
// and their weights. The AVX-512 kernel takes at most 16 taps.
void VerticalRowAvx2(const uint8_t* const* rows, const int32_t* k, int count, size_t row_bytes,
                     uint8_t* out);
void VerticalRowAvx512(const uint8_t* const* rows, const int32_t* k, int count, size_t row_bytes,
                       uint8_t* out);
#endif

}  // namespace kiln::pixels

#endif  // KILN_SRC_PIXELS_RESAMPLE_KERNELS_H_
