#include "core/sample_transform.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>

#include "pixels/simd.h"

#ifdef KILN_X86_SIMD
#include <immintrin.h>
#endif

namespace kiln::internal {

SamplePlan PlanSample(const LoaderOptions& o, uint32_t size, uint64_t epoch, uint64_t index, int h,
                      int w) {
  SamplePlan p;
  SampleRandom random = SampleRandom::For(o.seed, epoch, index);
  const int s = static_cast<int>(size);
  switch (o.crop_kind) {
    case CropKind::kWindow: {
      // A size x size window of the record (the whole record without a
      // crop), seeded or centred as torchvision's CenterCrop.
      CropBox b{0, 0, h, w};
      if (size > 0) {
        b.height = b.width = s;
        if (o.random_crop) {
          b.top = static_cast<int>(random.Below(static_cast<uint64_t>(h - s + 1)));
          b.left = static_cast<int>(random.Below(static_cast<uint64_t>(w - s + 1)));
        } else {
          b.top = CropOffset(h, s);
          b.left = CropOffset(w, s);
        }
      }
      p.box = p.source = b;
      p.resized_w = b.width;
      p.resized_h = b.height;
      break;
    }
    case CropKind::kRandomResized:
      p.box = p.source = RandomResizedCropBox(h, w, o.rrc, &random);
      p.resized_w = p.resized_h = s;
      break;
    case CropKind::kResizeCenter: {
      p.source = CropBox{0, 0, h, w};
      ResizeSpec spec;
      spec.resize_shorter = static_cast<int>(o.resize);
      if (!PlanResize(w, h, spec, &p.resized_w, &p.resized_h).ok()) {
        p.resized_w = w;  // not reached: Open checked the options
        p.resized_h = h;
      }
      p.x0 = CropOffset(p.resized_w, s);
      p.y0 = CropOffset(p.resized_h, s);
      // The window's visible part, mapped back onto the stored image.
      const int vx0 = std::max(p.x0, 0), vx1 = std::min(p.x0 + s, p.resized_w);
      const int vy0 = std::max(p.y0, 0), vy1 = std::min(p.y0 + s, p.resized_h);
      const double fx = static_cast<double>(w) / p.resized_w;
      const double fy = static_cast<double>(h) / p.resized_h;
      p.box.left = static_cast<int>(std::lround(vx0 * fx));
      p.box.top = static_cast<int>(std::lround(vy0 * fy));
      p.box.width = static_cast<int>(std::lround(vx1 * fx)) - p.box.left;
      p.box.height = static_cast<int>(std::lround(vy1 * fy)) - p.box.top;
      break;
    }
  }
  p.flip = o.random_flip && random.Coin();
  return p;
}

namespace {

// The SIMD kernels below exist for x86-64 only (KILN_X86_SIMD) and are
// chosen at run time by what the CPU supports (and UseSampleKernels); each
// gives exactly the portable code's values.

std::atomic<bool> g_simd{true};

bool Avx2F16cFma() {
  const SimdFeatures& cpu = CpuSimd();
  return cpu.avx2 && cpu.f16c && cpu.fma && g_simd.load(std::memory_order_relaxed);
}

#ifdef KILN_X86_SIMD
// (v / 255 - mean) / std of n uint8 values, as float32 or IEEE half: the
// table's float operations, two divisions per value.
__attribute__((target("avx2,f16c"))) size_t NormalizeDivAvx2(const uint8_t* in, size_t n,
                                                             float mean, float std, bool half,
                                                             void* out) {
  const __m256 k255 = _mm256_set1_ps(255.0f), m = _mm256_set1_ps(mean), sd = _mm256_set1_ps(std);
  size_t x = 0;
  for (; x + 8 <= n; x += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + x));
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    const __m256 y = _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(v, k255), m), sd);
    if (half) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + x),
                       _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      _mm256_storeu_ps(static_cast<float*>(out) + x, y);
    }
  }
  return x;
}

// fma(v, scale, shift) of n uint8 values to IEEE half, 16 per step: used
// only where it gives the table's half for each of the 256 values (the
// constructor checks them all), so the bytes are the table's.
__attribute__((target("avx2,f16c,fma"))) size_t NormalizeFmaHalfAvx2(const uint8_t* in, size_t n,
                                                                     float scale, float shift,
                                                                     uint16_t* out) {
  const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  size_t x = 0;
  for (; x + 16 <= n; x += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + x));
    const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    const __m128i h0 =
        _mm256_cvtps_ph(_mm256_fmadd_ps(v0, a, b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i h1 =
        _mm256_cvtps_ph(_mm256_fmadd_ps(v1, a, b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + x), _mm256_set_m128i(h1, h0));
  }
  return x;
}
#endif

}  // namespace

SampleWriter::SampleWriter(int channels, DType out, const std::vector<double>& mean,
                           const std::vector<double>& std)
    : channels_(channels), out_(out) {
  float m[4] = {0, 0, 0, 0}, sd[4] = {1, 1, 1, 1};
  for (int c = 0; c < channels && c < 4; ++c) {
    if (static_cast<size_t>(c) < mean.size()) m[c] = static_cast<float>(mean[c]);
    if (static_cast<size_t>(c) < std.size()) sd[c] = static_cast<float>(std[c]);
  }
  NormalizeTable(m, sd, std::min(channels, 4), table_);
  std::copy(m, m + 4, mean_);
  std::copy(sd, sd + 4, std_);
  for (int c = 0; c < std::min(channels, 4); ++c) {
    for (int v = 0; v < 256; ++v) half_[c][v] = FloatToHalf(table_[c][v]);
    // One fused multiply-add in place of the two divisions, where it rounds
    // to the same half for every one of the 256 values.
    scale_[c] = static_cast<float>(1.0 / (255.0 * static_cast<double>(sd[c])));
    shift_[c] = static_cast<float>(-static_cast<double>(m[c]) / static_cast<double>(sd[c]));
    fma_half_[c] = true;
    for (int v = 0; v < 256 && fma_half_[c]; ++v)
      fma_half_[c] =
          FloatToHalf(std::fma(static_cast<float>(v), scale_[c], shift_[c])) == half_[c][v];
  }
}

void SampleWriter::Reserve(int max_h, int max_w, int max_out) {
  const size_t c = static_cast<size_t>(channels_);
  const size_t h = std::max(max_h, 1), w = std::max(max_w, 1), out = std::max(max_out, 1);
  resized_.reserve(out * out * c);
  // A resampled axis of n <= max_out outputs reads ksize <= 2 x ceil(in /
  // out) + 1 taps each (outputs are at least 1 pixel); the horizontal pass
  // covers at most every input row.
  const size_t in = std::max(h, w), k = 2 * in + 3;
  for (pixels::AxisTaps* t : {&scratch_.horizontal, &scratch_.vertical}) {
    t->first.reserve(out);
    t->count.reserve(out);
    t->weights.reserve(out * k);
    t->work.reserve(k);
  }
  scratch_.temp.reserve(h * out);
  scratch_.acc.reserve(out);
  scratch_.rows.reserve(k);
  scratch_.plane_bases.reserve((out + 7) / 8);
  scratch_.plane_pairs.reserve((out + 7) / 8 * 4);
  scratch_.plane_pairs512.reserve((out + 15) / 16 * 4);
}

void SampleWriter::Write(const uint8_t* src, int h, int w, const SamplePlan& plan, int oh, int ow,
                         void* dst) {
  const int channels = channels_;
  const CropBox& b = plan.source;
  const size_t plane = static_cast<size_t>(oh) * ow;
  // The planes resampled and cut to the output window, mirrored when
  // flipped, zeros where it pads: straight into dst for uint8 output,
  // else into resized_ and from there normalized into dst.
  uint8_t* planes = static_cast<uint8_t*>(dst);
  if (out_ != DType::kUint8) {
    resized_.resize(plane * channels);
    planes = resized_.data();
  }
  const int vx0 = std::max(plan.x0, 0), vx1 = std::min(plan.x0 + ow, plan.resized_w);
  const int vy0 = std::max(plan.y0, 0), vy1 = std::min(plan.y0 + oh, plan.resized_h);
  const bool padded =
      vx0 - plan.x0 > 0 || vy0 - plan.y0 > 0 || vx1 - plan.x0 < ow || vy1 - plan.y0 < oh;
  if (padded || vx1 <= vx0 || vy1 <= vy0) std::memset(planes, 0, plane * channels);
  if (vx1 > vx0 && vy1 > vy0) {
    const int col = vx0 - plan.x0, width = vx1 - vx0;
    uint8_t* at =
        planes + static_cast<size_t>(vy0 - plan.y0) * ow + (plan.flip ? ow - col - width : col);
    const size_t w_bytes = static_cast<size_t>(w);
    pixels::ResamplePlanes(src + static_cast<size_t>(b.top) * w_bytes + b.left, w_bytes,
                                    w_bytes * h, channels, b.width, b.height,
                                    plan.source_w > 0 ? plan.source_w : b.width,
                                    plan.source_h > 0 ? plan.source_h : b.height,
                                    plan.resized_w, plan.resized_h, vx0, vy0, width, vy1 - vy0,
                                    plan.flip, at, ow, plane, &scratch_,
                                    plan.source_w > 0 ? plan.source_x0 : 0.0,
                                    plan.source_w > 0 ? plan.source_y0 : 0.0);
  }
  if (out_ == DType::kUint8) return;
  for (int c = 0; c < channels; ++c) {
    const uint8_t* v = planes + c * plane;
    const int t = std::min(c, 3);
    size_t x = 0;
    if (out_ == DType::kFloat16) {
      uint16_t* d = static_cast<uint16_t*>(dst) + c * plane;
#ifdef KILN_X86_SIMD
      if (Avx2F16cFma()) {
        x = fma_half_[t] ? NormalizeFmaHalfAvx2(v, plane, scale_[t], shift_[t], d)
                         : NormalizeDivAvx2(v, plane, mean_[t], std_[t], true, d);
      }
#endif
      for (; x < plane; ++x) d[x] = half_[t][v[x]];
    } else {
      float* d = static_cast<float*>(dst) + c * plane;
#ifdef KILN_X86_SIMD
      if (Avx2F16cFma()) x = NormalizeDivAvx2(v, plane, mean_[t], std_[t], false, d);
#endif
      for (; x < plane; ++x) d[x] = table_[t][v[x]];
    }
  }
}

void UseSampleKernels(bool simd) { g_simd.store(simd); }

void FieldWriter::Reserve(int max_out) {
  xs_.reserve(static_cast<size_t>(std::max(max_out, 1)));
  ys_.reserve(static_cast<size_t>(std::max(max_out, 1)));
}

namespace {

// The source index of each of `n` output pixels along one axis of a mask:
// PIL's NEAREST for crop(box).resize(size), which walks the box in steps of
// box / resized from half a step, adding the step per pixel, and truncates
// (ImagingScaleAffine: the same float sums, the same picks), for output
// pixels offset.. of the resized image; -1 where the output pads past it.
void NearestMap(int n, int offset, int resized, int first, int box, std::vector<int>* out) {
  out->assign(static_cast<size_t>(n), -1);
  const double step = static_cast<double>(box) / resized;
  double at = step * 0.5;
  for (int r = 0; r < resized && r < offset + n; ++r, at += step)
    if (r >= offset) (*out)[r - offset] = first + std::min(box - 1, static_cast<int>(at));
}

// Copies `fv` (of shape fv.shape, each dim at most out's) into `dst` laid
// out as `out` (the padded shape), zeros elsewhere.
void CopyPadded(const FieldView& fv, const Shape& out, size_t elem, uint8_t* dst) {
  const uint64_t total = FieldElements(out) * elem;
  if (fv.shape == out || fv.shape.ndim == 0) {
    std::memcpy(dst, fv.data, std::min<uint64_t>(fv.bytes, total));
    return;
  }
  std::memset(dst, 0, total);
  const int nd = fv.shape.ndim;
  const uint64_t rows = FieldElements(fv.shape) / std::max<uint32_t>(fv.shape.dims[nd - 1], 1);
  if (fv.shape.dims[nd - 1] == 0 || rows == 0) return;
  const size_t row = fv.shape.dims[nd - 1] * elem;
  std::array<uint32_t, kMaxDims> at{};
  for (uint64_t r = 0; r < rows; ++r) {
    // The row's place: its index over dims 0..nd-2 in the padded layout.
    uint64_t o = 0;
    for (int d = 0; d < nd - 1; ++d) o = o * out.dims[d] + at[d];
    std::memcpy(dst + o * out.dims[nd - 1] * elem, fv.data + r * row, row);
    for (int d = nd - 2; d >= 0; --d) {
      if (++at[d] < fv.shape.dims[d]) break;
      at[d] = 0;
    }
  }
}

}  // namespace

Status FieldWriter::Write(const LoaderField& f, const FieldView& fv, uint64_t index,
                          const SamplePlan& plan, int h, int w, int oh, int ow, uint8_t* dst,
                          int64_t* lengths) {
  const size_t elem = DTypeSize(f.dtype);
  // The manifest's largest sizes bound every record's: a record past them
  // (a manifest that lies) is refused, not written past the slot.
  for (int d = 0; d < fv.shape.ndim && f.role != LoaderField::kMask; ++d)
    if (fv.shape.ndim != f.shape.ndim || fv.shape.dims[d] > f.shape.dims[d])
      return Status::Corruption("record " + std::to_string(index) + ": its '" + f.name + "' is " +
                                fv.shape.ToString() + ", larger than the manifest's max_shape " +
                                f.shape.ToString());
  switch (f.role) {
    case LoaderField::kMask: {
      const int nd = fv.shape.ndim;
      const int mh = static_cast<int>(fv.shape.dims[nd - 2]);
      const int mw = static_cast<int>(fv.shape.dims[nd - 1]);
      if (mh != h || mw != w)
        return Status::Corruption("record " + std::to_string(index) + ": its '" + f.name + "' is " +
                                  std::to_string(mh) + "x" + std::to_string(mw) + ", its image " +
                                  std::to_string(h) + "x" + std::to_string(w) +
                                  ": a mask must match its image to follow its crop");
      const int planes = nd == 3 ? static_cast<int>(fv.shape.dims[0]) : 1;
      NearestMap(ow, plan.x0, plan.resized_w, plan.source.left, plan.source.width, &xs_);
      NearestMap(oh, plan.y0, plan.resized_h, plan.source.top, plan.source.height, &ys_);
      for (int k = 0; k < planes; ++k)
        for (int y = 0; y < oh; ++y) {
          uint8_t* out = dst + (static_cast<size_t>(k) * oh + y) * ow * elem;
          const int sy = ys_[y];
          for (int x = 0; x < ow; ++x) {
            const int sx = xs_[x];
            uint8_t* o = out + static_cast<size_t>(plan.flip ? ow - 1 - x : x) * elem;
            if (sy < 0 || sx < 0) {
              std::memset(o, 0, elem);
            } else {
              std::memcpy(o, fv.data + ((static_cast<size_t>(k) * mh + sy) * mw + sx) * elem, elem);
            }
          }
        }
      return Status::OK();
    }
    case LoaderField::kBoxes: {
      // x1, y1, x2, y2 in the stored image -> the resized box -> the output
      // window, clipped; a box with nothing left is dropped.
      const double sx = static_cast<double>(plan.resized_w) / plan.source.width;
      const double sy = static_cast<double>(plan.resized_h) / plan.source.height;
      const uint32_t n = fv.shape.dims[0];
      float* out = reinterpret_cast<float*>(dst);
      uint32_t kept = 0;
      for (uint32_t i = 0; i < n; ++i) {
        float b[4];
        std::memcpy(b, fv.data + i * 16, 16);
        auto clip = [](double v, int hi) { return std::min<double>(std::max(v, 0.0), hi); };
        double x1 = clip((b[0] - plan.source.left) * sx - plan.x0, ow);
        double x2 = clip((b[2] - plan.source.left) * sx - plan.x0, ow);
        const double y1 = clip((b[1] - plan.source.top) * sy - plan.y0, oh);
        const double y2 = clip((b[3] - plan.source.top) * sy - plan.y0, oh);
        if (!(x2 > x1 && y2 > y1)) continue;
        if (plan.flip) {
          const double t = x1;
          x1 = ow - x2;
          x2 = ow - t;
        }
        float* o = out + static_cast<size_t>(kept++) * 4;
        o[0] = static_cast<float>(x1);
        o[1] = static_cast<float>(y1);
        o[2] = static_cast<float>(x2);
        o[3] = static_cast<float>(y2);
      }
      std::memset(out + static_cast<size_t>(kept) * 4, 0, (f.shape.dims[0] - kept) * 16);
      if (lengths != nullptr) lengths[0] = kept;
      return Status::OK();
    }
    case LoaderField::kPlain:
      break;
  }
  CopyPadded(fv, f.shape, elem, dst);
  for (int k = 0; k < f.variable_dims && lengths != nullptr; ++k)
    lengths[k] = fv.shape.dims[f.variable[k]];
  return Status::OK();
}

}  // namespace kiln::internal
