// libkiln_opencv_codecs.so: the module through which kiln::image reaches
// OpenCV's imgcodecs (see opencv_codecs.h for why it is a module). It holds
// nothing but calls into OpenCV, with their exceptions caught here: none
// crosses the dlopen boundary.
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "opencv_codecs.h"

namespace {

cv::Mat Imdecode(const cv::Mat& buffer, int flags, std::string* error) {
  try {
    return cv::imdecode(buffer, flags);
  } catch (const cv::Exception& e) {
    *error = e.what();
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return cv::Mat();
}

bool Imwrite(const std::string& path, const cv::Mat& image, std::string* error) {
  try {
    return cv::imwrite(path, image);
  } catch (const cv::Exception& e) {
    *error = e.what();
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return false;
}

bool HaveImageWriter(const std::string& path) {
  try {
    return cv::haveImageWriter(path);
  } catch (const std::exception&) {
    return false;
  }
}

const kiln::image::internal::OpenCvCodecs kCodecs{Imdecode, Imwrite, HaveImageWriter};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kiln::image::internal::OpenCvCodecs*
kiln_opencv_codecs_v1() {
  return &kCodecs;
}
