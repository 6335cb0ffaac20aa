// Encoded image fields (codec kJpeg) on the loader's side (internal to
// kiln::core): a worker decodes only what a sample's plan needs - the rows
// and iMCU columns that cover its box, at the largest DCT scale (1/2, 1/4,
// 1/8) that keeps the box at least its output size when DCT scaling is on
// - and hands SampleWriter the box as planar CHW, with the plan rewritten
// for it. No allocation per sample once the buffers have grown.
//
// Exactness: at scale 1 the planes are exactly the box of a full decode,
// which is Pillow's decode of the same bytes (jpeg_codec.h), so the
// sample equals torchvision's on PIL. At scale 1/s the box is resized from
// the 1/s image with its edges at box / s (the origin rounded down to a
// pixel of the scaled image, the size kept fractional): docs/format.md
// states the error this gives, tests/core/encoded_image_test.cc bounds it.
//
// Thread-safety: an EncodedImageReader belongs to one worker.
#ifndef KILN_SRC_CORE_ENCODED_IMAGE_H_
#define KILN_SRC_CORE_ENCODED_IMAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/jpeg_codec.h"
#include "core/sample_transform.h"
#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"

namespace kiln::internal {

// The DCT scale (1, 2, 4 or 8) for a box of box_w x box_h resized to
// out_w x out_h: the largest that keeps box / scale >= out in both
// dimensions, 1 without `dct_scaling`.
int ChooseDctScale(int box_w, int box_h, int out_w, int out_h, bool dct_scaling);

class EncodedImageReader {
 public:
  // Decodes the part of the JPEG image `v` (C x H x W, codec kJpeg) that
  // `plan` resamples, and rewrites plan->source (and its fractional size)
  // so that SampleWriter::Write(planes(), height(), width(), *plan, ...)
  // writes the sample. Corruption naming `what` when the JPEG does not
  // decode or does not match its entry.
  Status Decode(const FieldView& v, bool dct_scaling, const std::string& what, SamplePlan* plan);
  const uint8_t* planes() const { return planes_.data(); }
  int height() const { return height_; }
  int width() const { return width_; }
  int scale() const { return scale_; }  // of the last Decode

 private:
  Decoder decoder_;
  JpegRegion region_;
  std::vector<uint8_t> planes_;
  int height_ = 0, width_ = 0, scale_ = 1;
};

// Interleaved rows (w x h x c, rows `stride` bytes apart) to planar CHW.
void Deinterleave(const uint8_t* src, size_t stride, int w, int h, int c, uint8_t* dst);

}  // namespace kiln::internal

#endif  // KILN_SRC_CORE_ENCODED_IMAGE_H_
