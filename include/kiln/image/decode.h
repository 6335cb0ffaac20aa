// Image decoding for kiln's build step.
//
// JPEG goes through TurboJPEG (with optional DCT-domain downscaling); PNG,
// BMP, WebP and TIFF go through OpenCV. Every path yields the pixels that
// PIL's `Image.open(path).convert("RGB")` (or `.convert("L")`) would give, so
// that a cache built by kiln matches what a torchvision pipeline sees.
//
// Thread-safety: Decode and ReadHeader may be called from any number of
// threads at once; each thread keeps its own TurboJPEG handle.
#ifndef KILN_IMAGE_DECODE_H_
#define KILN_IMAGE_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln::image {

// An 8-bit image, rows top to bottom, pixels interleaved (HWC): RGB order
// for 3 channels, luminance for 1.
struct ImageU8 {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 or 3
  std::vector<uint8_t> pixels;  // width * height * channels bytes

  // The size stored in the file's header. Equal to width/height unless the
  // decoder applied DCT-domain downscaling; then width = ceil(source_width *
  // scale_num / scale_denom) (likewise height), and the transform step uses
  // the source size to plan its geometry, so that downscaling never changes
  // the output size.
  int source_width = 0;
  int source_height = 0;
  int scale_num = 1;
  int scale_denom = 1;
};

struct DecodeOptions {
  // Output channels: 1 (luminance, PIL's convert("L")) or 3 (RGB).
  int channels = 3;
  // Images whose header claims more than this many pixels are rejected
  // before any pixel is decoded (decompression-bomb guard).
  int64_t max_pixels = 100'000'000;
  // When both are > 0, a JPEG may be decoded with TurboJPEG's DCT-domain
  // downscaling (1/2, 1/4) when the downscaled image is still at least twice
  // min_width x min_height (so 1/2 needs an image >= 4x that size; the
  // fidelity measurements behind the margin are in decode.cc). Pass the size
  // the resize step
  // needs (PlanResize in transform.h). 0 = always decode at full size.
  int min_width = 0;
  int min_height = 0;
};

// Decodes the encoded image data[0, size) into *out (its previous contents
// are replaced). `name` (normally the file path) is used in error messages.
// The caller keeps ownership of `data`; it is not retained.
// Returns OK; InvalidArgument for bad options or a header over max_pixels;
// Corruption for empty, truncated or undecodable data (the message names
// `name` and the reason); NotSupported for unusual-but-valid images
// (e.g. 12-bit JPEG).
Status Decode(const uint8_t* data, size_t size, const std::string& name,
              const DecodeOptions& options, ImageU8* out);

// Opens the decoders kiln loads on first use - OpenCV's codecs, for every
// format but JPEG (src/image/opencv_codecs.h says why they are not linked)
// - and returns OK, or NotSupported naming the module and each path tried.
// kiln build calls it before it writes anything, so that a missing module
// stops the build instead of rejecting every PNG.
Status CheckDecoders();

// Decodes a segmentation mask: one 8-bit channel of class indices (a PNG
// of PIL's mode "L"), kept exactly as stored. Corruption for data that does
// not decode; InvalidArgument naming `name` for colour, alpha or 16-bit
// samples (a palette PNG decodes as colours: save masks as mode "L") and
// for more than max_pixels pixels.
Status DecodeMask(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels,
                  ImageU8* out);

// Reads only the header of a JPEG, PNG, BMP, WebP or TIFF image and stores
// its width and height (no pixel decode). Returns OK, Corruption for a
// damaged header, NotSupported for a format it cannot read headers of.
Status ReadHeader(const uint8_t* data, size_t size, const std::string& name, int* width,
                  int* height);

// (library, version) of the codecs compiled in, e.g. {"opencv", "4.6.0"}.
std::vector<std::pair<std::string, std::string>> CodecVersions();

}  // namespace kiln::image

#endif  // KILN_IMAGE_DECODE_H_
