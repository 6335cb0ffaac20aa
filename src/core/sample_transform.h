// The loader's load-time geometry for one sample (internal to kiln::core):
// which box of the stored image becomes the output (RandomResizedCrop,
// Resize + CenterCrop, or a plain window), whether it is flipped, and the
// pass that writes it into a batch slot - each plane of the stored CHW
// image resampled with the build's PIL-exact resize (flipped in the same
// pass), and written as uint8 or normalized float16/float32 (the same
// float32 operations as torchvision's ToTensor + Normalize; for float16 one
// fused multiply-add where it gives the same half for all 256 values).
//
// Thread-safety: PlanSample is pure; a SampleWriter belongs to one thread
// (it keeps that thread's buffers).
#ifndef KILN_SRC_CORE_SAMPLE_TRANSFORM_H_
#define KILN_SRC_CORE_SAMPLE_TRANSFORM_H_

#include <cstdint>
#include <vector>

#include "pixels/resample.h"
#include "kiln/cache_reader.h"
#include "kiln/geometry.h"
#include "kiln/loader.h"
#include "kiln/record.h"

namespace kiln::internal {

// Where one sample's output comes from in its stored image (C x h x w).
struct SamplePlan {
  // The part of the stored image the output shows (reported by
  // Loader's boxes). For a resize + centre crop: the crop window mapped
  // back onto the stored image (rounded), all of it when padded.
  CropBox box;
  bool flip = false;
  // The output is the `source` box of the stored image resized to
  // resized_w x resized_h, of which the size x size window at (x0, y0) is
  // kept (negative: zero padding before the image).
  CropBox source;
  // When source_w > 0: the box is [source_x0, source_x0 + source_w) x
  // [source_y0, source_y0 + source_h) of the pixels `source` holds
  // (fractional: a box of a JPEG decoded at a DCT scale, encoded_image.h).
  double source_x0 = 0, source_y0 = 0, source_w = 0, source_h = 0;
  int resized_w = 0, resized_h = 0;
  int x0 = 0, y0 = 0;
};

// The plan for sample `index` of `epoch` (its random draws come from
// SampleRandom::For(o.seed, epoch, index)), for a stored image of h x w and
// an output of `size` x `size`.
SamplePlan PlanSample(const LoaderOptions& o, uint32_t size, uint64_t epoch, uint64_t index, int h,
                      int w);

// Writes samples as their plans say, reusing its buffers.
class SampleWriter {
 public:
  // `out`: the output dtype (uint8, float16 or float32); mean/std (in [0,
  // 1] pixel units, `channels` values) are used for float output, empty for
  // 0 and 1.
  SampleWriter(int channels, DType out, const std::vector<double>& mean,
               const std::vector<double>& std);

  // Grows every buffer to what the largest case needs - images of at most
  // max_h x max_w, outputs of at most max_out x max_out - so that Write
  // allocates nothing afterwards.
  void Reserve(int max_h, int max_w, int max_out);

  // Writes the CHW uint8 image `src` (channels x h x w) into `dst`
  // (channels x oh x ow of the output dtype) as `plan` says.
  void Write(const uint8_t* src, int h, int w, const SamplePlan& plan, int oh, int ow, void* dst);

 private:
  int channels_;
  DType out_;
  float mean_[4], std_[4];
  float table_[4][256];
  uint16_t half_[4][256];
  // fma(v, scale_, shift_) rounds to half_[c][v] for every v (checked):
  // the float16 kernel's one operation in place of two divisions.
  float scale_[4], shift_[4];
  bool fma_half_[4] = {false, false, false, false};
  std::vector<uint8_t> resized_;  // the output window, CHW (float output)
  pixels::ResampleScratch scratch_;
};

// Writes a record's other fields (kiln::LoaderField) into a batch, the
// mask and boxes following their image's plan. Keeps its buffers.
class FieldWriter {
 public:
  // Grows the buffers for outputs of at most max_out x max_out.
  void Reserve(int max_out);
  // Writes field `f` of record `index` (its stored view `fv`; the image was
  // h x w and goes out oh x ow as `plan` says) into `dst` (f.sample_bytes,
  // the shape at the current output size) and its lengths (when the field
  // has variable dims). Corruption when a mask's H x W are not its image's.
  Status Write(const LoaderField& f, const FieldView& fv, uint64_t index, const SamplePlan& plan,
               int h, int w, int oh, int ow, uint8_t* dst, int64_t* lengths);

 private:
  std::vector<int> xs_, ys_;  // a mask's source column and row per output pixel
};

// Whether SampleWriter may use the CPU's SIMD kernels (the default) or
// only the portable code; both give the same values. For tests.
void UseSampleKernels(bool simd);

}  // namespace kiln::internal

#endif  // KILN_SRC_CORE_SAMPLE_TRANSFORM_H_
