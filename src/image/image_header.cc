#include "image_header.h"

#include <cstring>

namespace kiln::image::internal {
namespace {

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint32_t Le32(const uint8_t* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}
uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t Le24(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16);
}

Status Truncated(const std::string& name, const char* format) {
  return Status::Corruption(name + ": truncated " + format + " header");
}

Status Store(int64_t w, int64_t h, const std::string& name, const char* format, int* width,
             int* height) {
  if (w <= 0 || h <= 0 || w > INT32_MAX || h > INT32_MAX) {
    return Status::Corruption(name + ": " + format + " header gives an invalid size " +
                              std::to_string(w) + "x" + std::to_string(h));
  }
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  return Status::OK();
}

Status ReadPng(const uint8_t* d, size_t n, const std::string& name, int* w, int* h) {
  // Signature (8), IHDR length (4), "IHDR" (4), width (4), height (4).
  if (n < 24) return Truncated(name, "PNG");
  if (std::memcmp(d + 12, "IHDR", 4) != 0) return Status::Corruption(name + ": PNG lacks IHDR");
  return Store(Be32(d + 16), Be32(d + 20), name, "PNG", w, h);
}

Status ReadBmp(const uint8_t* d, size_t n, const std::string& name, int* w, int* h) {
  if (n < 26) return Truncated(name, "BMP");
  uint32_t info_size = Le32(d + 14);
  if (info_size == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
    return Store(Le16(d + 18), Le16(d + 20), name, "BMP", w, h);
  }
  int64_t width = static_cast<int32_t>(Le32(d + 18));
  int64_t height = static_cast<int32_t>(Le32(d + 22));
  if (height < 0) height = -height;  // top-down bitmap
  return Store(width, height, name, "BMP", w, h);
}

Status ReadWebp(const uint8_t* d, size_t n, const std::string& name, int* w, int* h) {
  if (n < 30) return Truncated(name, "WebP");
  const uint8_t* chunk = d + 12;
  if (std::memcmp(chunk, "VP8X", 4) == 0) {  // extended: 24-bit canvas size minus one
    // Flags byte, bit 1: an animation (frames in ANMF chunks, which neither
    // libwebp's still-image decoder nor OpenCV reads).
    if (d[20] & 0x02)
      return Status::NotSupported(name +
                                  ": an animated WebP; kiln reads still images: extract one "
                                  "frame (webpmux -get frame 1 IN -o OUT) or convert it");
    return Store(int64_t{Le24(d + 24)} + 1, int64_t{Le24(d + 27)} + 1, name, "WebP", w, h);
  }
  if (std::memcmp(chunk, "VP8L", 4) == 0) {  // lossless: 14-bit sizes minus one
    if (d[20] != 0x2F) return Status::Corruption(name + ": bad WebP lossless signature");
    uint32_t bits = Le32(d + 21);
    return Store(int64_t{bits & 0x3FFF} + 1, int64_t{(bits >> 14) & 0x3FFF} + 1, name, "WebP", w,
                 h);
  }
  if (std::memcmp(chunk, "VP8 ", 4) == 0) {  // lossy: key frame start code, 14-bit sizes
    if (d[23] != 0x9D || d[24] != 0x01 || d[25] != 0x2A) {
      return Status::Corruption(name + ": bad WebP key frame start code");
    }
    return Store(Le16(d + 26) & 0x3FFF, Le16(d + 28) & 0x3FFF, name, "WebP", w, h);
  }
  return Status::Corruption(name + ": unknown WebP chunk");
}

Status ReadTiff(const uint8_t* d, size_t n, const std::string& name, int* w, int* h) {
  if (n < 8) return Truncated(name, "TIFF");
  const bool le = d[0] == 'I';
  auto u16 = [&](size_t off) { return le ? Le16(d + off) : Be16(d + off); };
  auto u32 = [&](size_t off) { return le ? Le32(d + off) : Be32(d + off); };
  if (u16(2) != 42) return Status::NotSupported(name + ": BigTIFF is not supported");
  uint64_t ifd = u32(4);
  if (ifd + 2 > n) return Truncated(name, "TIFF");
  uint32_t entries = u16(ifd);
  int64_t width = -1, height = -1;
  for (uint32_t i = 0; i < entries; ++i) {
    uint64_t e = ifd + 2 + uint64_t{i} * 12;
    if (e + 12 > n) return Truncated(name, "TIFF");
    uint16_t tag = u16(e), type = u16(e + 2);
    if (tag != 256 && tag != 257) continue;
    int64_t value = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : -1;
    if (value < 0) return Status::Corruption(name + ": TIFF size tag has an unexpected type");
    (tag == 256 ? width : height) = value;
  }
  if (width < 0 || height < 0) return Status::Corruption(name + ": TIFF lacks its size tags");
  return Store(width, height, name, "TIFF", w, h);
}

}  // namespace

ImageFormat SniffFormat(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::kJpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return ImageFormat::kBmp;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) {
    return ImageFormat::kWebp;
  }
  if (n >= 4 && (std::memcmp(d, "II*\0", 4) == 0 || std::memcmp(d, "MM\0*", 4) == 0 ||
                 std::memcmp(d, "II+\0", 4) == 0 || std::memcmp(d, "MM\0+", 4) == 0)) {
    return ImageFormat::kTiff;
  }
  return ImageFormat::kUnknown;
}

Status ReadNonJpegHeader(ImageFormat format, const uint8_t* data, size_t size,
                         const std::string& name, int* width, int* height) {
  switch (format) {
    case ImageFormat::kPng:
      return ReadPng(data, size, name, width, height);
    case ImageFormat::kBmp:
      return ReadBmp(data, size, name, width, height);
    case ImageFormat::kWebp:
      return ReadWebp(data, size, name, width, height);
    case ImageFormat::kTiff:
      return ReadTiff(data, size, name, width, height);
    default:
      break;
  }
  return Status::NotSupported(name + ": no header reader for this format");
}

}  // namespace kiln::image::internal
