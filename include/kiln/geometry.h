// Image geometry with torchvision's semantics, and the per-sample random
// draws of load-time augmentation: one owner for every size, offset and box
// kiln computes, whether at build time (kiln::image::ResizeAndCrop) or at
// load time (the loader's RandomResizedCrop and ResizeCenterCrop).
//
// Sizes are (width, height) in the build's functions, as PIL's; boxes are
// (top, left, height, width), as torchvision's get_params.
//
// Thread-safety: all functions are pure; call them from any thread.
#ifndef KILN_GEOMETRY_H_
#define KILN_GEOMETRY_H_

#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln {

struct ResizeSpec {
  // torchvision Resize(S): the shorter side becomes S, the longer side
  // int(S * long / short). 0 = no shorter-side resize.
  int resize_shorter = 0;
  // torchvision CenterCrop(C): a C x C crop from the centre; zero padding
  // when the image is smaller (as torchvision pads). 0 = no crop.
  int crop = 0;
  // Resize to exactly squash_w x squash_h, ignoring aspect (torchvision
  // Resize((H, W))). Both or neither; excludes resize_shorter.
  int squash_w = 0;
  int squash_h = 0;
  // torchvision Resize(S, max_size=N) (with resize_shorter S) or
  // Resize(None, max_size=N) (without): when the longer side, after the
  // shorter-side resize if any, exceeds N, it becomes N and the shorter one
  // int(N * short / long) (at least 1); smaller images keep their size.
  // FFCV's max_resolution. 0 = no bound. Excludes squash; with
  // resize_shorter, must exceed it (as torchvision requires).
  int max_side = 0;
};

// The size after the resize step, before the crop, for an image whose
// header says in_w x in_h. Returns InvalidArgument for non-positive sizes
// or a bad spec.
Status PlanResize(int in_w, int in_h, const ResizeSpec& spec, int* resized_w, int* resized_h);

// The final output size (after resize and crop) for an in_w x in_h image.
Status PlanGeometry(int in_w, int in_h, const ResizeSpec& spec, int* out_w, int* out_h);

// torchvision CenterCrop's offset of a `crop`-long window in a `size`-long
// axis: int(round((size - crop) / 2.0)) with Python's round-half-to-even,
// or, when the crop is larger, minus the zero padding before the image,
// (crop - size) // 2.
int CropOffset(int size, int crop);

// A box in an image, as torchvision's RandomResizedCrop.get_params returns it.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};

// RandomResizedCrop's ranges, torchvision's defaults.
struct RandomResizedCropParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};
// InvalidArgument unless 0 < scale_min <= scale_max <= 1 and
// 0 < ratio_min <= ratio_max.
Status CheckRandomResizedCrop(const RandomResizedCropParams& p);

// A stream of random numbers from one 64-bit state (SplitMix64): each
// sample's draws come from its own stream, seeded by (seed, epoch, index),
// so that they do not depend on which worker, thread or rank loads it.
class SampleRandom {
 public:
  explicit SampleRandom(uint64_t state) : state_(state) {}
  // The stream of sample `index` in `epoch` of a loader seeded `seed`.
  static SampleRandom For(uint64_t seed, uint64_t epoch, uint64_t index);
  uint64_t Next();
  double Uniform(double lo, double hi);  // in [lo, hi)
  uint64_t Below(uint64_t n);            // in [0, n); n > 0
  bool Coin() { return (Next() >> 63) != 0; }

 private:
  uint64_t state_;
};

// torchvision's RandomResizedCrop.get_params for an image of height x width:
// up to 10 attempts at a box of area fraction U(scale) and aspect ratio
// exp(U(log ratio)), each side int(round(...)) and kept when it fits,
// placed uniformly; else the central fallback (the whole image, or its
// central part clamped to the ratio range). `fallback`, when given, says
// whether the fallback was taken. REQUIRES: height, width >= 1.
CropBox RandomResizedCropBox(int height, int width, const RandomResizedCropParams& p,
                             SampleRandom* random, bool* fallback = nullptr);

// FFCV's progressive resizing (its start_ramp, end_ramp, min_res, max_res):
// the output size of each epoch for a loader's set_resolution / kiln train
// --res-schedule. The ring is sized once for max_res.
struct ResolutionSchedule {
  uint32_t min_res = 0, max_res = 0;
  int64_t start_ramp = 0, end_ramp = 0;  // epochs
  uint32_t step = 32;
  bool enabled() const { return max_res > 0; }
};

// The size of `epoch`: min_res up to start_ramp, max_res from end_ramp on,
// in between the linear interpolation rounded (half to even, as numpy) to
// a multiple of `step` - FFCV's get_resolution - kept within [min_res,
// max_res] (FFCV does not clamp; it matters only when a bound is not a
// multiple of step).
uint32_t ResolutionAt(const ResolutionSchedule& s, int64_t epoch);

// Parses "MIN:MAX:START:END" or "MIN:MAX:START:END:STEP" (e.g. 160:192:0:2,
// step 32 by default); InvalidArgument naming what is wrong unless
// 1 <= MIN <= MAX, 0 <= START <= END and STEP >= 1.
Status ParseResolutionSchedule(const std::string& text, ResolutionSchedule* out);

// IEEE binary16 bits of `value`, rounded to nearest even (NaN stays NaN,
// overflow gives infinity).
uint16_t FloatToHalf(float value);

// The normalized value of each uint8 pixel value per channel: (v / 255 -
// mean[c]) / std[c] in float32, the operations of torchvision's ToTensor
// then Normalize. mean/std: `channels` values each, or null for 0 and 1.
void NormalizeTable(const float* mean, const float* std, int channels, float table[][256]);

}  // namespace kiln

#endif  // KILN_GEOMETRY_H_
