// The resampler's x86 SIMD kernels (resample_kernels.h says what each is).
#include "pixels/resample_kernels.h"

#ifdef KILN_X86_SIMD

#include <immintrin.h>

#include <algorithm>
#include <cstring>

// GCC 12 reports the AVX-512 intrinsics' own undefined pass-through
// operands as maybe uninitialized (a false positive in its headers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kiln::pixels {
namespace {

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

}  // namespace

// AVX2 vertical pass of one output row: 16 bytes at a time, all taps summed
// in registers.
__attribute__((target("avx2"))) void VerticalRowAvx2(const uint8_t* const* rows, const int32_t* k,
                                                     int count, size_t row_bytes, uint8_t* out) {
  size_t j = 0;
  const __m256i half = _mm256_set1_epi32(kHalf);
  for (; j + 16 <= row_bytes; j += 16) {
    __m256i lo = half, hi = half;
    for (int i = 0; i < count; ++i) {
      const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + j));
      const __m256i w = _mm256_set1_epi32(k[i]);
      lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), w));
      hi = _mm256_add_epi32(hi, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), w));
    }
    lo = _mm256_srai_epi32(lo, kPrecisionBits);
    hi = _mm256_srai_epi32(hi, kPrecisionBits);
    // packs/packus work per 128-bit lane: put the lanes back in order.
    __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
    const __m128i b =
        _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), b);
  }
  for (; j < row_bytes; ++j) {
    int32_t acc = kHalf;
    for (int i = 0; i < count; ++i) acc += rows[i][j] * k[i];
    out[j] = Clip8(acc);
  }
}

namespace {

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
#define KILN_WV(i) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + (i)*16))
    const __m256i px = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fa))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + fb)), 1);
    const __m256i v0 = _mm256_shuffle_epi8(px, taps01);
    const __m256i v1 = _mm256_shuffle_epi8(px, taps23);
    __m256i hi =
        _mm256_add_epi32(_mm256_madd_epi16(v0, KILN_WV(0)), _mm256_madd_epi16(v1, KILN_WV(2)));
    __m256i lo =
        _mm256_add_epi32(_mm256_madd_epi16(v0, KILN_WV(1)), _mm256_madd_epi16(v1, KILN_WV(3)));
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

}  // namespace

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

namespace {

// The kSpan input bytes of a group of outputs from `base` in a row of in_w
// bytes: in place, or, where they would run past the row, a zero-padded
// copy of the row's end in `tail`.
template <size_t kSpan>
inline const uint8_t* GroupBytes(const uint8_t* src, int base, int in_w, uint8_t (&tail)[kSpan]) {
  if (base + static_cast<int>(kSpan) <= in_w) return src + base;
  std::memset(tail, 0, kSpan);
  std::memcpy(tail, src + base, static_cast<size_t>(in_w - base));
  return tail;
}

// The first `count` bytes of `b8` into dst (the last group of a row).
inline void StoreFirst(uint8_t* dst, __m128i b8, int count) {
  alignas(16) uint8_t last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), b8);
  std::memcpy(dst, last, static_cast<size_t>(count));
}

// AVX2 horizontal pass of one plane (1 channel), eight output pixels per
// step. A step's windows lie in the 16 input bytes from the group's base
// (PlanePairs checks it); the bytes are broadcast to both 128-bit halves
// and shuffled into int16 pairs (tap 2p, tap 2p+1) of each output, so one
// vpmaddwd does two taps of four outputs per half. Weights are split as in
// HorizontalRowMaddAvx2 (k = kh * 2^11 + kl), so the sums are the portable
// code's integers. A group whose 16 bytes would run past the row reads a
// zero-padded copy of the row's end.
template <int kPairs>
__attribute__((target("avx2"))) void HorizontalRowPlaneAvx2(const uint8_t* src, int in_w,
                                                            const int* bases,
                                                            const PlaneTapPair* pairs, int n,
                                                            uint8_t* dst) {
  const __m256i half = _mm256_set1_epi32(kHalf);
  alignas(16) uint8_t tail[16];
  const int groups = (n + 7) / 8;
  for (int g = 0; g < groups; ++g) {
    const uint8_t* p = GroupBytes(src, bases[g], in_w, tail);
    const __m256i px =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const PlaneTapPair* q = pairs + static_cast<size_t>(g) * kPairs;
    __m256i hi = _mm256_setzero_si256(), lo = half;
    for (int k = 0; k < kPairs; ++k) {
      const __m256i v = _mm256_shuffle_epi8(
          px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[k].control)));
      hi = _mm256_add_epi32(
          hi, _mm256_madd_epi16(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[k].kh))));
      lo = _mm256_add_epi32(
          lo, _mm256_madd_epi16(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[k].kl))));
    }
    // >> 22, then saturate to int16 and to uint8: Clip8 on each lane.
    const __m256i v =
        _mm256_srai_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo), kPrecisionBits);
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b8 = _mm_packus_epi16(w16, w16);
    const int ox = g * 8;
    if (ox + 8 <= n) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + ox), b8);
    } else {
      StoreFirst(dst + ox, b8, n - ox);
    }
  }
}

// AVX-512 horizontal pass of one plane, sixteen outputs per step: their
// windows lie in the 32 input bytes from the group's base (PlanePairs512
// checks it), and one vpermb builds the int16 pairs (tap 2p, tap 2p+1) of
// all sixteen (zeroing the high bytes). Weights split as in the AVX2
// kernels, so the sums are the portable code's integers; they are never
// negative, so an unsigned saturation to bytes is Clip8.
template <int kPairs>
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void HorizontalRowPlaneAvx512(
    const uint8_t* src, int in_w, const int* bases, const PlaneTapPair512* pairs, int n,
    uint8_t* dst) {
  const __m512i half = _mm512_set1_epi32(kHalf);
  constexpr __mmask64 kLowBytes = 0x5555555555555555ULL;
  alignas(32) uint8_t tail[32];
  const int groups = (n + 15) / 16;
  for (int g = 0; g < groups; ++g) {
    const uint8_t* p = GroupBytes(src, bases[g], in_w, tail);
    const __m512i px =
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const PlaneTapPair512* q = pairs + static_cast<size_t>(g) * kPairs;
    __m512i hi = _mm512_setzero_si512(), lo = half;
    for (int k = 0; k < kPairs; ++k) {
      const __m512i v =
          _mm512_maskz_permutexvar_epi8(kLowBytes, _mm512_loadu_si512(q[k].control), px);
      hi = _mm512_add_epi32(hi, _mm512_madd_epi16(v, _mm512_loadu_si512(q[k].kh)));
      lo = _mm512_add_epi32(lo, _mm512_madd_epi16(v, _mm512_loadu_si512(q[k].kl)));
    }
    const __m512i v =
        _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi, 11), lo), kPrecisionBits);
    const __m128i b8 = _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, _mm512_setzero_si512()));
    const int ox = g * 16;
    if (ox + 16 <= n) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + ox), b8);
    } else {
      StoreFirst(dst + ox, b8, n - ox);
    }
  }
}

}  // namespace

// AVX-512 vertical pass of one output row, 32 bytes per step: each pair of
// tap rows widened to int16 and interleaved, one vpmaddwd per pair for
// two taps (weights split as above; an odd last tap is paired with weight
// 0). The portable code's integers, saturated the same way.
__attribute__((target("avx512f,avx512bw"))) void VerticalRowAvx512(const uint8_t* const* rows,
                                                                   const int32_t* k, int count,
                                                                   size_t row_bytes, uint8_t* out) {
  __m512i kh[8], kl[8];
  const int pairs = (count + 1) / 2;
  for (int p = 0; p < pairs && p < 8; ++p) {
    const int32_t k0 = k[2 * p], k1 = 2 * p + 1 < count ? k[2 * p + 1] : 0;
    kh[p] = _mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(k1 >> 11) << 16) |
                                                   static_cast<uint32_t>(k0 >> 11)));
    kl[p] = _mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(k1 & 2047) << 16) |
                                                   static_cast<uint32_t>(k0 & 2047)));
  }
  const __m512i half = _mm512_set1_epi32(kHalf);
  size_t j = 0;
  for (; j + 32 <= row_bytes; j += 32) {
    __m512i hi_a = _mm512_setzero_si512(), lo_a = half, hi_b = _mm512_setzero_si512(), lo_b = half;
    for (int p = 0; p < pairs; ++p) {
      const uint8_t* r0 = rows[2 * p];
      const uint8_t* r1 = 2 * p + 1 < count ? rows[2 * p + 1] : r0;
      const __m512i a =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + j)));
      const __m512i b =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + j)));
      const __m512i first = _mm512_unpacklo_epi16(a, b), second = _mm512_unpackhi_epi16(a, b);
      hi_a = _mm512_add_epi32(hi_a, _mm512_madd_epi16(first, kh[p]));
      lo_a = _mm512_add_epi32(lo_a, _mm512_madd_epi16(first, kl[p]));
      hi_b = _mm512_add_epi32(hi_b, _mm512_madd_epi16(second, kh[p]));
      lo_b = _mm512_add_epi32(lo_b, _mm512_madd_epi16(second, kl[p]));
    }
    const __m512i va =
        _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi_a, 11), lo_a), kPrecisionBits);
    const __m512i vb =
        _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi_b, 11), lo_b), kPrecisionBits);
    // Per 128-bit lane: va holds outputs 8L..8L+3, vb 8L+4..8L+7; packus
    // puts them in order, and saturates as Clip8 does with the byte step.
    const __m256i b8 = _mm512_cvtusepi16_epi8(_mm512_packus_epi32(va, vb));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), b8);
  }
  for (; j < row_bytes; ++j) {
    int32_t acc = kHalf;
    for (int i = 0; i < count; ++i) acc += rows[i][j] * k[i];
    out[j] = Clip8(acc);
  }
}

namespace {

// PlanePairs and PlanePairs512: groups of kGroup outputs whose windows span
// at most kSpan input bytes. Control bytes are -128 but for the taps' own
// bytes: vpshufb writes zeros for them (the high bytes of the int16
// pairs), vpermb reads byte 0 (its zero mask clears the high bytes), and a
// tap past a window's count weighs 0 either way.
template <int kGroup, int kSpan, typename Pair>
int GroupPairs(const AxisTaps& taps, int n, std::vector<int>* bases, std::vector<Pair>* out) {
  int max_count = 1;
  for (int ox = 0; ox < n; ++ox) max_count = std::max(max_count, taps.count[ox]);
  const int pairs = (max_count + 1) / 2;
  if (pairs > 4) return 0;
  const int groups = (n + kGroup - 1) / kGroup;
  bases->assign(static_cast<size_t>(groups), 0);
  Pair empty;
  std::fill(std::begin(empty.control), std::end(empty.control), int8_t(-128));
  std::fill(std::begin(empty.kh), std::end(empty.kh), int16_t(0));
  std::fill(std::begin(empty.kl), std::end(empty.kl), int16_t(0));
  out->assign(static_cast<size_t>(groups) * pairs, empty);
  for (int g = 0; g < groups; ++g) {
    const int begin = g * kGroup, end = std::min(n, begin + kGroup);
    int lo = -1, hi = 0;
    for (int ox = begin; ox < end; ++ox) {
      if (taps.count[ox] == 0) continue;
      lo = lo < 0 ? taps.first[ox] : std::min(lo, taps.first[ox]);
      hi = std::max(hi, taps.first[ox] + taps.count[ox]);
    }
    if (lo < 0) lo = 0;
    if (hi - lo > kSpan) return 0;
    (*bases)[g] = lo;
    for (int ox = begin; ox < end; ++ox) {
      const int j = ox - begin;
      const int32_t* k = &taps.weights[static_cast<size_t>(ox) * taps.ksize];
      for (int t = 0; t < taps.count[ox]; ++t) {
        Pair& q = (*out)[static_cast<size_t>(g) * pairs + t / 2];
        q.control[4 * j + 2 * (t % 2)] = static_cast<int8_t>(taps.first[ox] + t - lo);
        q.kh[2 * j + t % 2] = static_cast<int16_t>(k[t] >> 11);
        q.kl[2 * j + t % 2] = static_cast<int16_t>(k[t] & 2047);
      }
    }
  }
  return pairs;
}

}  // namespace

int PlanePairs(const AxisTaps& taps, int n, std::vector<int>* bases,
               std::vector<PlaneTapPair>* out) {
  return GroupPairs<8, 16>(taps, n, bases, out);
}

int PlanePairs512(const AxisTaps& taps, int n, std::vector<int>* bases,
                  std::vector<PlaneTapPair512>* out) {
  return GroupPairs<16, 32>(taps, n, bases, out);
}

RowFn Sse41Row(int channels) {
  return channels == 3 ? HorizontalRowSse41<3> : HorizontalRowSse41<4>;
}

void MaddRowAvx2(int channels, int pairs, const uint8_t* src, int in_w, const AxisTaps& taps,
                 const int16_t* w, int n, uint8_t* dst) {
  if (channels == 3 && pairs == 2)
    HorizontalRowMaddAvx2<3, 2>(src, in_w, taps, w, n, dst);
  else if (channels == 3)
    HorizontalRowMaddAvx2<3, 3>(src, in_w, taps, w, n, dst);
  else if (pairs == 2)
    HorizontalRowMaddAvx2<4, 2>(src, in_w, taps, w, n, dst);
  else
    HorizontalRowMaddAvx2<4, 3>(src, in_w, taps, w, n, dst);
}

void PlaneRowAvx2(int pairs, const uint8_t* src, int in_w, const int* bases,
                  const PlaneTapPair* plan, int n, uint8_t* dst) {
  switch (pairs) {
    case 1:
      HorizontalRowPlaneAvx2<1>(src, in_w, bases, plan, n, dst);
      break;
    case 2:
      HorizontalRowPlaneAvx2<2>(src, in_w, bases, plan, n, dst);
      break;
    case 3:
      HorizontalRowPlaneAvx2<3>(src, in_w, bases, plan, n, dst);
      break;
    default:
      HorizontalRowPlaneAvx2<4>(src, in_w, bases, plan, n, dst);
      break;
  }
}

void PlaneRowAvx512(int pairs, const uint8_t* src, int in_w, const int* bases,
                    const PlaneTapPair512* plan, int n, uint8_t* dst) {
  switch (pairs) {
    case 1:
      HorizontalRowPlaneAvx512<1>(src, in_w, bases, plan, n, dst);
      break;
    case 2:
      HorizontalRowPlaneAvx512<2>(src, in_w, bases, plan, n, dst);
      break;
    case 3:
      HorizontalRowPlaneAvx512<3>(src, in_w, bases, plan, n, dst);
      break;
    default:
      HorizontalRowPlaneAvx512<4>(src, in_w, bases, plan, n, dst);
      break;
  }
}

}  // namespace kiln::pixels

#endif  // KILN_X86_SIMD
