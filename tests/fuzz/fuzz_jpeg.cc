// libFuzzer target: the JPEG of an encoded record field, as the loader,
// verify and kiln.Cache decode it (core/jpeg_codec.h). Input: 4 control
// bytes - the claimed width and height (one byte each, 1..256), the
// channels (1 or 3) and the DCT scale (1, 2, 4, 8) with a box - then the
// JPEG bytes. Every input either decodes, with a region inside the image
// that covers the box, or is a Corruption: never a crash, a read past the
// data or an allocation beyond the claimed image.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/jpeg_codec.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int w = 1 + data[0], h = 1 + data[1];
  const int channels = (data[2] & 1) ? 3 : 1;
  const int scale = 1 << ((data[2] >> 1) & 3);
  const int sw = kiln::internal::JpegScaledSize(w, scale);
  const int sh = kiln::internal::JpegScaledSize(h, scale);
  const int left = (data[3] & 15) % sw, top = (data[3] >> 4) % sh;
  const int bw = sw - left, bh = sh - top;
  const std::vector<uint8_t> jpeg(data + 4, data + size);
  static kiln::internal::Decoder decoder;  // reused, as a loader worker's is
  kiln::internal::JpegRegion r;
  const kiln::Status s =
      decoder.Decode(jpeg.data(), jpeg.size(), w, h, channels, scale, left, top, bw, bh, &r);
  if (!s.ok()) {
    KILN_FUZZ_CHECK(s.IsCorruption());
    return 0;
  }
  KILN_FUZZ_CHECK(r.channels == channels);
  KILN_FUZZ_CHECK(r.x0 >= 0 && r.y0 >= 0 && r.x0 + r.width <= sw && r.y0 + r.height <= sh);
  KILN_FUZZ_CHECK(r.x0 <= left && r.y0 <= top);
  KILN_FUZZ_CHECK(r.x0 + r.width >= left + bw && r.y0 + r.height >= top + bh);
  KILN_FUZZ_CHECK(r.pixels.size() == static_cast<size_t>(r.width) * r.height * channels);
  return 0;
}
