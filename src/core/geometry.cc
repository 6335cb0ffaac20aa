// kiln geometry: torchvision's sizes and offsets, RandomResizedCrop's box.
#include "kiln/geometry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace kiln {
namespace {

std::string Size(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

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

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

int CropOffset(int size, int crop) {
  if (crop > size) return -((crop - size) / 2);
  const int d = size - crop;
  const int q = d / 2;
  if (d % 2 == 0) return q;
  return q % 2 == 0 ? q : q + 1;  // q + 0.5 rounds to the even neighbour
}

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

Status CheckRandomResizedCrop(const RandomResizedCropParams& p) {
  if (!(p.scale_min > 0 && p.scale_min <= p.scale_max && p.scale_max <= 1))
    return Status::InvalidArgument(
        "RandomResizedCrop: scale must satisfy 0 < min <= max <= 1, not (" +
        std::to_string(p.scale_min) + ", " + std::to_string(p.scale_max) + ")");
  if (!(p.ratio_min > 0 && p.ratio_min <= p.ratio_max && std::isfinite(p.ratio_max)))
    return Status::InvalidArgument("RandomResizedCrop: ratio must satisfy 0 < min <= max, not (" +
                                   std::to_string(p.ratio_min) + ", " +
                                   std::to_string(p.ratio_max) + ")");
  return Status::OK();
}

SampleRandom SampleRandom::For(uint64_t seed, uint64_t epoch, uint64_t index) {
  return SampleRandom(Mix(Mix(seed ^ Mix(epoch + 0xA5A5ull)) ^ index));
}

uint64_t SampleRandom::Next() {
  state_ = Mix(state_);
  return state_;
}

double SampleRandom::Uniform(double lo, double hi) {
  const double u = static_cast<double>(Next() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

uint64_t SampleRandom::Below(uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
}

CropBox RandomResizedCropBox(int height, int width, const RandomResizedCropParams& p,
                             SampleRandom* random, bool* fallback) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(p.ratio_min), log_hi = std::log(p.ratio_max);
  if (fallback != nullptr) *fallback = false;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * random->Uniform(p.scale_min, p.scale_max);
    const double aspect = std::exp(random->Uniform(log_lo, log_hi));
    // Python's round(): half to even, as nearbyint in the default mode.
    const double w = std::nearbyint(std::sqrt(target * aspect));
    const double h = std::nearbyint(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox b;
      b.height = static_cast<int>(h);
      b.width = static_cast<int>(w);
      b.top = static_cast<int>(random->Below(static_cast<uint64_t>(height - b.height + 1)));
      b.left = static_cast<int>(random->Below(static_cast<uint64_t>(width - b.width + 1)));
      return b;
    }
  }
  if (fallback != nullptr) *fallback = true;
  CropBox b;
  const double in_ratio = static_cast<double>(width) / height;
  if (in_ratio < p.ratio_min) {
    b.width = width;
    b.height = static_cast<int>(std::nearbyint(width / p.ratio_min));
  } else if (in_ratio > p.ratio_max) {
    b.height = height;
    b.width = static_cast<int>(std::nearbyint(height * p.ratio_max));
  } else {
    b.width = width;
    b.height = height;
  }
  b.top = (height - b.height) / 2;
  b.left = (width - b.width) / 2;
  return b;
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

void NormalizeTable(const float* mean, const float* std, int channels, float table[][256]) {
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

uint32_t ResolutionAt(const ResolutionSchedule& s, int64_t epoch) {
  if (epoch <= s.start_ramp) return s.min_res;
  if (epoch >= s.end_ramp) return s.max_res;
  const double at = s.min_res + static_cast<double>(epoch - s.start_ramp) /
                                    static_cast<double>(s.end_ramp - s.start_ramp) *
                                    (static_cast<double>(s.max_res) - s.min_res);
  const double steps = std::nearbyint(at / s.step);  // the default rounding: half to even
  const double res = std::min<double>(s.max_res, std::max<double>(s.min_res, steps * s.step));
  return static_cast<uint32_t>(res);
}

Status ParseResolutionSchedule(const std::string& text, ResolutionSchedule* out) {
  const std::string usage = "resolution schedule '" + text +
                            "': expected MIN:MAX:START:END[:STEP] (sizes, then the epoch indices "
                            "of the ramp, e.g. 160:192:0:2)";
  std::vector<int64_t> v;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t colon = std::min(text.find(':', at), text.size());
    const std::string part = text.substr(at, colon - at);
    if (part.empty() || part.size() > 9 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return Status::InvalidArgument(usage);
    v.push_back(std::stoll(part));
    at = colon + 1;
  }
  if (v.size() != 4 && v.size() != 5) return Status::InvalidArgument(usage);
  ResolutionSchedule s;
  s.min_res = static_cast<uint32_t>(v[0]);
  s.max_res = static_cast<uint32_t>(v[1]);
  s.start_ramp = v[2];
  s.end_ramp = v[3];
  if (v.size() == 5) s.step = static_cast<uint32_t>(v[4]);
  if (s.min_res < 1 || s.max_res < s.min_res)
    return Status::InvalidArgument(usage + ": need 1 <= MIN <= MAX");
  if (s.end_ramp < s.start_ramp) return Status::InvalidArgument(usage + ": need START <= END");
  if (s.step < 1) return Status::InvalidArgument(usage + ": need STEP >= 1");
  *out = s;
  return Status::OK();
}

}  // namespace kiln
