// Header-only size readers for the non-JPEG formats kiln decodes through
// OpenCV (internal to kiln::image). OpenCV has no public header-only API, and
// the max_pixels guard must run before any pixel buffer is allocated.
#ifndef KILN_SRC_IMAGE_IMAGE_HEADER_H_
#define KILN_SRC_IMAGE_IMAGE_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln::image::internal {

enum class ImageFormat { kUnknown, kJpeg, kPng, kBmp, kWebp, kTiff };

// The format the leading bytes announce (kUnknown when none matches).
ImageFormat SniffFormat(const uint8_t* data, size_t size);

// Reads width and height from a PNG, BMP, WebP or TIFF header.
// Corruption when the header is truncated or inconsistent; NotSupported for
// kJpeg (use ReadJpegHeader) and kUnknown.
Status ReadNonJpegHeader(ImageFormat format, const uint8_t* data, size_t size,
                         const std::string& name, int* width, int* height);

}  // namespace kiln::image::internal

#endif  // KILN_SRC_IMAGE_IMAGE_HEADER_H_
