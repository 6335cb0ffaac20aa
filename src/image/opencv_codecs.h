// OpenCV's image codecs (imgcodecs), loaded on first use (internal to
// kiln::image).
//
// Debian's libopencv_imgcodecs links about 120 libraries (GDAL, GDCM,
// Poppler, HDF5, ...). Linked into kiln, loading them cost every process
// ~65 ms before main - more than `kiln verify --level full` spends reading
// a 1 GB warm cache, and paid also by commands that decode nothing. So
// kiln::image reaches imgcodecs only through a small module,
// libkiln_opencv_codecs.so (opencv_codecs_module.cc), that it opens with
// dlopen the first time a non-JPEG image is decoded or an image written.
// JPEGs are decoded by TurboJPEG, linked directly.
//
// Where the module is looked for: $KILN_OPENCV_CODECS (a file) alone when
// it is set, else in order: beside the running executable, <executable>/../lib/kiln/, the build
// tree's copy, the install prefix's lib/kiln/.
//
// Thread-safety: LoadOpenCvCodecs may be called from any thread; the
// module is opened once per process and never closed.
#ifndef KILN_SRC_IMAGE_OPENCV_CODECS_H_
#define KILN_SRC_IMAGE_OPENCV_CODECS_H_

#include <opencv2/core.hpp>
#include <string>

#include "kiln/status.h"

namespace kiln::image::internal {

// The module's functions. None throws: an OpenCV exception becomes false
// (or an empty Mat) with *error set to its text.
struct OpenCvCodecs {
  // cv::imdecode(buffer, flags); an empty Mat when it cannot decode
  // (*error empty when OpenCV gave no reason).
  cv::Mat (*imdecode)(const cv::Mat& buffer, int flags, std::string* error);
  // cv::imwrite(path, image); false when nothing was written.
  bool (*imwrite)(const std::string& path, const cv::Mat& image, std::string* error);
  // cv::haveImageWriter(path): whether path's extension names a format
  // OpenCV can write.
  bool (*have_image_writer)(const std::string& path);
};

// The name of the entry point the module exports (extern "C"), returning
// const OpenCvCodecs*; the version changes when OpenCvCodecs does.
inline constexpr const char* kOpenCvCodecsEntry = "kiln_opencv_codecs_v1";

// Sets *out to the module's functions, opening it the first time.
// Returns NotSupported naming every path tried (and dlopen's reason) when
// no module loads; `why` says what needed it, e.g. "to decode a.png".
Status LoadOpenCvCodecs(const std::string& why, const OpenCvCodecs** out);

}  // namespace kiln::image::internal

#endif  // KILN_SRC_IMAGE_OPENCV_CODECS_H_
