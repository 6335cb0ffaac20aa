// kiln::image decoding: format dispatch, the max_pixels guard, the DCT
// scaling rule and the conversions that make every format look like PIL's
// convert("RGB") / convert("L").
#include "kiln/image/decode.h"

#include <algorithm>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>  // the IMREAD_ flags only: the codecs load on first use

#include "image_header.h"
#include "opencv_codecs.h"
#include "turbojpeg_decoder.h"

namespace kiln::image {
namespace {

using internal::ImageFormat;
using internal::JpegColor;
using internal::JpegPixels;

// DCT-domain downscaling is used only when the downscaled JPEG is still at
// least kDctMargin times the size the resize step needs, so 1/2 needs an
// image >= 4x the needed size and 1/4 one >= 8x. Measured with
// tools/fidelity_check.py --with-dct (Resize(256) + CenterCrop(224) against
// torchvision, sample_data/photos plus upscaled 1100x900 / 2400x1800 JPEGs):
// with margin 1 (any factor keeping the needed size) 1/2 gave MAE up to 2.03,
// max error 45 and 5.3% of values off by > 8 (512x512 photos decoded at
// 256x256, i.e. no antialiasing left for the resize), and 1/4 gave MAE up to
// 0.53; margin 1.5 still left MAE 0.64 on one photo. Margin 2 gave MAE <= 0.18,
// max error 3, none off by > 8. The DCT scaler is a weaker low-pass filter
// than PIL's triangle filter, so the remaining resize must do most of the
// reduction for the results to agree.
constexpr double kDctMargin = 2.0;

// PIL's RGB -> L (Convert.c, L24): ITU-R 601-2 luma in 16-bit fixed point.
inline uint8_t Luma(int r, int g, int b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// PIL's MULDIV255: round(a * b / 255) for a, b in [0, 255].
inline int MulDiv255(int a, int b) {
  int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

void Resize(ImageU8* out, int width, int height, int channels) {
  out->width = width;
  out->height = height;
  out->channels = channels;
  out->pixels.resize(static_cast<size_t>(width) * height * channels);
}

// Packed RGB -> luminance, `count` pixels.
void RgbToLuma(const uint8_t* rgb, size_t count, uint8_t* gray) {
  for (size_t i = 0; i < count; ++i, rgb += 3) gray[i] = Luma(rgb[0], rgb[1], rgb[2]);
}

Status CheckPixels(int width, int height, const DecodeOptions& options, const std::string& name) {
  const int64_t pixels = int64_t{width} * height;
  if (pixels > options.max_pixels) {
    return Status::InvalidArgument(
        name + ": image is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
        std::to_string(pixels) + " pixels, over the limit of " +
        std::to_string(options.max_pixels) + " (DecodeOptions::max_pixels)");
  }
  return Status::OK();
}

// Picks the strongest DCT-domain downscale among 1/2 and 1/4 (the factors
// TurboJPEG accelerates with SIMD; 1/8 is DC-only and too coarse) that keeps
// the decoded image at least kDctMargin times the needed size.
void ChooseJpegScale(int width, int height, const DecodeOptions& options, int* num, int* denom) {
  *num = 1;
  *denom = 1;
  if (options.min_width <= 0 || options.min_height <= 0) return;
  const double need_w = options.min_width * kDctMargin;
  const double need_h = options.min_height * kDctMargin;
  for (int d : {4, 2}) {
    bool offered = false;
    for (const auto& f : internal::JpegScalingFactors()) offered |= (f.first == 1 && f.second == d);
    if (!offered) continue;
    if (internal::JpegScaledSize(width, 1, d) >= need_w &&
        internal::JpegScaledSize(height, 1, d) >= need_h) {
      *denom = d;
      return;
    }
  }
}

Status DecodeJpegImage(const uint8_t* data, size_t size, const std::string& name,
                       const DecodeOptions& options, ImageU8* out) {
  internal::JpegHeader header;
  KILN_RETURN_IF_ERROR(internal::ReadJpegHeader(data, size, name, &header));
  KILN_RETURN_IF_ERROR(CheckPixels(header.width, header.height, options, name));
  int num, denom;
  ChooseJpegScale(header.width, header.height, options, &num, &denom);
  const int w = internal::JpegScaledSize(header.width, num, denom);
  const int h = internal::JpegScaledSize(header.height, num, denom);
  const size_t count = static_cast<size_t>(w) * h;
  out->source_width = header.width;
  out->source_height = header.height;
  out->scale_num = num;
  out->scale_denom = denom;

  if (header.color == JpegColor::kCmyk) {
    // TurboJPEG cannot produce RGB from CMYK/YCCK. PIL reads every CMYK JPEG
    // with Adobe's inverted polarity ("CMYK;I") and converts with
    // R = (255 - K') - (C' * (255 - K') / 255), C' = 255 - C (Convert.c);
    // in stored values that is R = K - MULDIV255(255 - C, K).
    std::vector<uint8_t> cmyk(count * 4);
    KILN_RETURN_IF_ERROR(
        internal::DecodeJpeg(data, size, name, header, JpegPixels::kCmyk, num, denom, cmyk.data()));
    Resize(out, w, h, options.channels);
    uint8_t* dst = out->pixels.data();
    for (size_t i = 0; i < count; ++i) {
      const uint8_t* p = &cmyk[i * 4];
      const int k = p[3];
      int rgb[3];
      for (int c = 0; c < 3; ++c) rgb[c] = std::clamp(k - MulDiv255(255 - p[c], k), 0, 255);
      if (options.channels == 1) {
        dst[i] = Luma(rgb[0], rgb[1], rgb[2]);
      } else {
        for (int c = 0; c < 3; ++c) dst[i * 3 + c] = static_cast<uint8_t>(rgb[c]);
      }
    }
    return Status::OK();
  }
  if (options.channels == 3 || header.color == JpegColor::kGray) {
    // Gray JPEG -> RGB: libjpeg replicates the value, as PIL's L -> RGB does.
    Resize(out, w, h, options.channels);
    return internal::DecodeJpeg(data, size, name, header,
                                options.channels == 1 ? JpegPixels::kGray : JpegPixels::kRgb, num,
                                denom, out->pixels.data());
  }
  // Colour JPEG -> 1 channel: decode RGB then apply PIL's luma, so that the
  // result matches Image.open(p).convert("L") rather than the raw Y plane.
  std::vector<uint8_t> rgb(count * 3);
  KILN_RETURN_IF_ERROR(
      internal::DecodeJpeg(data, size, name, header, JpegPixels::kRgb, num, denom, rgb.data()));
  Resize(out, w, h, 1);
  RgbToLuma(rgb.data(), count, out->pixels.data());
  return Status::OK();
}

// cv::imdecode(IMREAD_UNCHANGED) of data[0, size) through the codecs
// module; `what` ("image", "mask") words the Corruption for data that does
// not decode.
Status ImdecodeUnchanged(const uint8_t* data, size_t size, const std::string& name,
                         const char* what, cv::Mat* decoded) {
  const internal::OpenCvCodecs* codecs = nullptr;
  KILN_RETURN_IF_ERROR(internal::LoadOpenCvCodecs("to decode " + name, &codecs));
  std::string error;
  const cv::Mat buffer(1, static_cast<int>(size), CV_8UC1, const_cast<uint8_t*>(data));
  *decoded = codecs->imdecode(buffer, cv::IMREAD_UNCHANGED, &error);
  if (!error.empty())
    return Status::Corruption(name + ": cannot decode " + what + ": " + error);
  if (decoded->empty())
    return Status::Corruption(name + ": cannot decode " + what +
                              " (damaged, truncated or not an image)");
  return Status::OK();
}

// OpenCV path: PNG, BMP, WebP, TIFF (and whatever else imdecode knows).
Status DecodeWithOpenCv(const uint8_t* data, size_t size, const std::string& name,
                        const DecodeOptions& options, ImageU8* out) {
  cv::Mat decoded;
  KILN_RETURN_IF_ERROR(ImdecodeUnchanged(data, size, name, "image", &decoded));
  KILN_RETURN_IF_ERROR(CheckPixels(decoded.cols, decoded.rows, options, name));
  const int src_channels = decoded.channels();
  if (src_channels < 1 || src_channels > 4) {
    return Status::NotSupported(name + ": images with " + std::to_string(src_channels) +
                                " channels are not supported");
  }
  // 16-bit samples keep their high byte: PIL 9.4 opens 16-bit RGB(A) PNGs
  // with rawmode "RGB;16B", which takes the most significant byte (v >> 8).
  // (For 16-bit grayscale PIL clamps to 255 instead, which destroys the
  // image; kiln uses v >> 8 there too.)
  cv::Mat bytes;
  if (decoded.depth() == CV_8U) {
    bytes = decoded;
  } else if (decoded.depth() == CV_16U) {
    bytes.create(decoded.rows, decoded.cols, CV_MAKETYPE(CV_8U, src_channels));
    for (int y = 0; y < decoded.rows; ++y) {
      const uint16_t* s = decoded.ptr<uint16_t>(y);
      uint8_t* d = bytes.ptr<uint8_t>(y);
      for (int x = 0; x < decoded.cols * src_channels; ++x) d[x] = static_cast<uint8_t>(s[x] >> 8);
    }
  } else {
    return Status::NotSupported(name + ": only 8- and 16-bit integer images are supported");
  }

  out->source_width = decoded.cols;
  out->source_height = decoded.rows;
  out->scale_num = out->scale_denom = 1;
  Resize(out, decoded.cols, decoded.rows, options.channels);
  uint8_t* dst = out->pixels.data();
  // OpenCV gives gray, gray+alpha, BGR or BGRA; alpha is dropped, as PIL's
  // convert("RGB") drops it (no compositing).
  const bool gray_source = src_channels <= 2;
  for (int y = 0; y < bytes.rows; ++y) {
    const uint8_t* s = bytes.ptr<uint8_t>(y);
    for (int x = 0; x < bytes.cols; ++x, s += src_channels) {
      if (gray_source) {
        if (options.channels == 1) {
          *dst++ = s[0];
        } else {
          dst[0] = dst[1] = dst[2] = s[0];
          dst += 3;
        }
      } else if (options.channels == 1) {
        *dst++ = Luma(s[2], s[1], s[0]);
      } else {
        dst[0] = s[2];
        dst[1] = s[1];
        dst[2] = s[0];
        dst += 3;
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status ReadHeader(const uint8_t* data, size_t size, const std::string& name, int* width,
                  int* height) {
  if (data == nullptr || size == 0) return Status::Corruption(name + ": empty file");
  const ImageFormat format = internal::SniffFormat(data, size);
  if (format == ImageFormat::kJpeg) {
    internal::JpegHeader header;
    KILN_RETURN_IF_ERROR(internal::ReadJpegHeader(data, size, name, &header));
    *width = header.width;
    *height = header.height;
    return Status::OK();
  }
  if (format == ImageFormat::kUnknown) {
    return Status::NotSupported(name + ": not a JPEG, PNG, BMP, WebP or TIFF image");
  }
  return internal::ReadNonJpegHeader(format, data, size, name, width, height);
}

Status Decode(const uint8_t* data, size_t size, const std::string& name,
              const DecodeOptions& options, ImageU8* out) {
  if (options.channels != 1 && options.channels != 3) {
    return Status::InvalidArgument(name + ": DecodeOptions::channels must be 1 or 3, not " +
                                   std::to_string(options.channels));
  }
  if (data == nullptr || size == 0) return Status::Corruption(name + ": empty file");
  if (size > static_cast<size_t>(INT32_MAX)) {
    return Status::InvalidArgument(name + ": encoded image over 2 GiB");
  }
  const ImageFormat format = internal::SniffFormat(data, size);
  if (format == ImageFormat::kJpeg) return DecodeJpegImage(data, size, name, options, out);
  if (format != ImageFormat::kUnknown) {
    // Cheap guard before OpenCV allocates anything.
    int width = 0, height = 0;
    KILN_RETURN_IF_ERROR(internal::ReadNonJpegHeader(format, data, size, name, &width, &height));
    KILN_RETURN_IF_ERROR(CheckPixels(width, height, options, name));
  }
  Status status = DecodeWithOpenCv(data, size, name, options, out);
  if (!status.ok() && format == ImageFormat::kUnknown && status.IsCorruption()) {
    return Status::Corruption(name +
                              ": not a recognised image (no JPEG, PNG, BMP, WebP or TIFF "
                              "signature, and OpenCV cannot decode it)");
  }
  return status;
}

Status CheckDecoders() {
  const internal::OpenCvCodecs* codecs = nullptr;
  return internal::LoadOpenCvCodecs("to decode images other than JPEG", &codecs);
}

Status DecodeMask(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels,
                  ImageU8* out) {
  cv::Mat decoded;
  KILN_RETURN_IF_ERROR(ImdecodeUnchanged(data, size, name, "mask", &decoded));
  if (decoded.channels() != 1 || decoded.depth() != CV_8U)
    return Status::InvalidArgument(
        name +
        ": a mask must be one 8-bit channel of class indices (PIL mode \"L\"); this one has " +
        std::to_string(decoded.channels()) + " channel(s) of " +
        (decoded.depth() == CV_8U ? "8" : "more than 8") +
        " bits (a palette PNG decodes as colours: save it with Image.convert(\"L\") on the "
        "indices, e.g. Image.fromarray(np.array(img)))");
  if (static_cast<int64_t>(decoded.cols) * decoded.rows > max_pixels)
    return Status::InvalidArgument(name + ": " + std::to_string(decoded.cols) + "x" +
                                   std::to_string(decoded.rows) + " is over --max-pixels");
  out->width = out->source_width = decoded.cols;
  out->height = out->source_height = decoded.rows;
  out->channels = 1;
  out->scale_num = out->scale_denom = 1;
  out->pixels.resize(static_cast<size_t>(decoded.cols) * decoded.rows);
  for (int y = 0; y < decoded.rows; ++y)
    std::memcpy(out->pixels.data() + static_cast<size_t>(y) * decoded.cols, decoded.ptr<uint8_t>(y),
                decoded.cols);
  return Status::OK();
}

}  // namespace kiln::image
