// The one place kiln talks to TurboJPEG (internal to kiln::image).
//
// Thread-safety: TurboJPEG handles are not thread-safe, so every function
// here uses a handle owned by the calling thread (created on first use,
// destroyed when the thread exits).
#ifndef KILN_SRC_IMAGE_TURBOJPEG_DECODER_H_
#define KILN_SRC_IMAGE_TURBOJPEG_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln::image::internal {

enum class JpegColor { kGray, kColor, kCmyk };  // kCmyk covers CMYK and YCCK

struct JpegHeader {
  int width = 0;
  int height = 0;
  JpegColor color = JpegColor::kColor;
};

// The pixel layout DecodeJpeg writes: 1, 3 or 4 bytes per pixel.
enum class JpegPixels { kGray, kRgb, kCmyk };

// True when data starts with a JPEG SOI marker.
bool LooksLikeJpeg(const uint8_t* data, size_t size);

// Reads the JPEG header. Corruption (naming `name`) when it is unreadable.
Status ReadJpegHeader(const uint8_t* data, size_t size, const std::string& name,
                      JpegHeader* header);

// TurboJPEG's DCT-domain scaling factors as (num, denom) pairs.
const std::vector<std::pair<int, int>>& JpegScalingFactors();

// Size of a dimension decoded at num/denom (TurboJPEG's TJSCALED: ceil).
inline int JpegScaledSize(int size, int num, int denom) {
  return static_cast<int>((static_cast<int64_t>(size) * num + denom - 1) / denom);
}

// Decodes into `dst` (JpegScaledSize(width) x JpegScaledSize(height) pixels
// of `pixels` layout, rows packed). Truncated or damaged data is an error
// (TJFLAG_STOPONWARNING), never a silently padded image. REQUIRES: `dst`
// holds that many bytes.
Status DecodeJpeg(const uint8_t* data, size_t size, const std::string& name,
                  const JpegHeader& header, JpegPixels pixels, int scale_num, int scale_denom,
                  uint8_t* dst);

}  // namespace kiln::image::internal

#endif  // KILN_SRC_IMAGE_TURBOJPEG_DECODER_H_
