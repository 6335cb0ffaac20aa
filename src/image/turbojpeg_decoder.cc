#include "turbojpeg_decoder.h"

#include <turbojpeg.h>

#include <climits>

namespace kiln::image::internal {
namespace {

// Owns one TurboJPEG decompressor handle.
class TjHandle {
 public:
  TjHandle() : handle_(tjInitDecompress()) {}
  ~TjHandle() {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle get() const { return handle_; }
  // A handle that has failed on a damaged file can fail every later file
  // with a stale error (seen with libjpeg-turbo 2.1.5: "Bogus marker
  // length" on good JPEGs after "Invalid component ID"), so it is replaced.
  void Renew() {
    if (handle_ != nullptr) tjDestroy(handle_);
    handle_ = tjInitDecompress();
  }

 private:
  tjhandle handle_;
};

// The calling thread's handle, or null when TurboJPEG could not create one.
TjHandle& ThreadHandleOwner() {
  thread_local TjHandle handle;
  return handle;
}
tjhandle ThreadHandle() { return ThreadHandleOwner().get(); }

// The single translator from a TurboJPEG failure to a Status.
Status TjError(tjhandle handle, const std::string& name, const char* what) {
  std::string reason = handle != nullptr ? tjGetErrorStr2(handle) : tjGetErrorStr2(nullptr);
  bool warning = handle != nullptr && tjGetErrorCode(handle) == TJERR_WARNING;
  if (handle != nullptr && handle == ThreadHandle()) ThreadHandleOwner().Renew();
  return Status::Corruption(name + ": " + what +
                            (warning ? " (damaged or truncated JPEG): " : ": ") + reason);
}

Status GetHandle(const std::string& name, tjhandle* out) {
  *out = ThreadHandle();
  if (*out == nullptr) return TjError(nullptr, name, "cannot create a TurboJPEG decompressor");
  return Status::OK();
}

Status CheckSize(size_t size, const std::string& name) {
  if (size > ULONG_MAX) return Status::InvalidArgument(name + ": JPEG data too large");
  return Status::OK();
}

}  // namespace

bool LooksLikeJpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

Status ReadJpegHeader(const uint8_t* data, size_t size, const std::string& name,
                      JpegHeader* header) {
  KILN_RETURN_IF_ERROR(CheckSize(size, name));
  tjhandle handle;
  KILN_RETURN_IF_ERROR(GetHandle(name, &handle));
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(handle, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    return TjError(handle, name, "cannot read JPEG header");
  }
  if (width <= 0 || height <= 0) {
    return Status::Corruption(name + ": JPEG header gives an empty image");
  }
  header->width = width;
  header->height = height;
  switch (colorspace) {
    case TJCS_GRAY:
      header->color = JpegColor::kGray;
      break;
    case TJCS_CMYK:
    case TJCS_YCCK:
      header->color = JpegColor::kCmyk;
      break;
    default:
      header->color = JpegColor::kColor;
      break;
  }
  return Status::OK();
}

const std::vector<std::pair<int, int>>& JpegScalingFactors() {
  static const std::vector<std::pair<int, int>> factors = [] {
    std::vector<std::pair<int, int>> out;
    int count = 0;
    tjscalingfactor* list = tjGetScalingFactors(&count);
    for (int i = 0; list != nullptr && i < count; ++i) out.emplace_back(list[i].num, list[i].denom);
    return out;
  }();
  return factors;
}

Status DecodeJpeg(const uint8_t* data, size_t size, const std::string& name,
                  const JpegHeader& header, JpegPixels pixels, int scale_num, int scale_denom,
                  uint8_t* dst) {
  KILN_RETURN_IF_ERROR(CheckSize(size, name));
  tjhandle handle;
  KILN_RETURN_IF_ERROR(GetHandle(name, &handle));
  int format = TJPF_RGB;
  int bytes_per_pixel = 3;
  switch (pixels) {
    case JpegPixels::kGray:
      format = TJPF_GRAY;
      bytes_per_pixel = 1;
      break;
    case JpegPixels::kRgb:
      format = TJPF_RGB;
      bytes_per_pixel = 3;
      break;
    case JpegPixels::kCmyk:
      format = TJPF_CMYK;
      bytes_per_pixel = 4;
      break;
  }
  const int width = JpegScaledSize(header.width, scale_num, scale_denom);
  const int height = JpegScaledSize(header.height, scale_num, scale_denom);
  // Passing the scaled size makes TurboJPEG pick the matching DCT scaling.
  if (tjDecompress2(handle, data, static_cast<unsigned long>(size), dst, width,
                    width * bytes_per_pixel, height, format, TJFLAG_STOPONWARNING) != 0) {
    return TjError(handle, name, "cannot decode JPEG");
  }
  return Status::OK();
}

}  // namespace kiln::image::internal
