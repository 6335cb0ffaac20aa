// The JPEG codec of encoded record fields (internal to kiln::core): what
// kiln build and kiln.Writer store (Encode, or a source's own bytes), and
// what the loader, verify, export and the Python Cache decode (Decoder).
// libjpeg-turbo's libjpeg API, because it alone offers decoding a part of
// an image: jpeg_crop_scanline for the columns, jpeg_skip_scanlines for the
// rows, at a DCT scale of 1/2, 1/4 or 1/8. (kiln::image decodes source
// files through TurboJPEG; this is the record side.)
//
// Exactness: the decoder keeps libjpeg's defaults - the accurate integer
// IDCT (JDCT_ISLOW) and fancy (triangle) chroma upsampling - which is what
// Pillow's JPEG decoder uses, so a full decode at scale 1 is Pillow's
// Image.open(...).convert("RGB") of the same bytes. A region is decoded
// one pixel wider and taller on every side than asked (where the image
// has the pixels), so that the upsampler's edge handling at the region's
// border never touches the pixels returned: the region equals the same
// pixels of a full decode (tests/core/jpeg_codec_test.cc checks it).
//
// Thread-safety: a Decoder belongs to one thread; Encode and ReadJpegInfo
// are reentrant.
#ifndef KILN_SRC_CORE_JPEG_CODEC_H_
#define KILN_SRC_CORE_JPEG_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::internal {

struct JpegInfo {
  int width = 0, height = 0;
  int components = 0;  // 1 (grayscale), 3 (YCbCr or RGB), 4 (CMYK/YCCK)
};

// True when `data` starts with a JPEG SOI marker.
bool IsJpeg(const uint8_t* data, size_t size);

// Reads the header of the JPEG in `data`. Corruption, with libjpeg's
// reason, when it is not a readable JPEG.
Status ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info);

// The DCT scales a region decode may use: 1, 2, 4 or 8 (the output is the
// image at 1/scale, each dimension ceil(size / scale), as libjpeg computes).
inline int JpegScaledSize(int size, int scale) { return (size + scale - 1) / scale; }

// A part of a JPEG, decoded: `width` x `height` pixels of `channels`
// interleaved bytes (rows packed) in `pixels`, which are the columns
// [x0, x0 + width) and rows [y0, y0 + height) of the image at the scale
// asked for.
struct JpegRegion {
  std::vector<uint8_t> pixels;
  int x0 = 0, y0 = 0, width = 0, height = 0;
  int channels = 0;
};

class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Decodes the JPEG in `data`, which must be an image_w x image_h one
  // (checked before any pixel is decoded), at 1/scale (1, 2, 4, 8) as
  // `channels` (1: the JPEG must be grayscale; 3: RGB from YCbCr, RGB or
  // grayscale) into `out`, covering at least the box [left, left + w) x
  // [top, top + h) of the scaled image (clamped to it; w or h 0: the whole
  // image). `out`'s buffer is reused. Corruption with libjpeg's reason when
  // the data are not a JPEG, are damaged (a warning is an error), or have
  // another size or other components; the box's pixels are exact (see
  // above).
  Status Decode(const uint8_t* data, size_t size, int image_w, int image_h, int channels,
                int scale, int left, int top, int w, int h, JpegRegion* out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Encodes `pixels` (width x height x channels interleaved; channels 1 or
// 3) as a baseline JPEG of `quality` (1..100; 4:2:0 chroma for colour, as
// libjpeg's and Pillow's defaults) into `out` (replaced).
Status EncodeJpeg(const uint8_t* pixels, int width, int height, int channels, int quality,
                  std::vector<uint8_t>* out);

}  // namespace kiln::internal

#endif  // KILN_SRC_CORE_JPEG_CODEC_H_
