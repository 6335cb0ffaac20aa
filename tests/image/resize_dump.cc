// kiln_resize_dump IMAGE RESIZE CROP OUT.raw [--dct]
//
// Decodes IMAGE to RGB, applies torchvision's Resize(RESIZE) +
// CenterCrop(CROP) as kiln does, and writes the uint8 HWC result to OUT.raw.
// With --dct a JPEG may be decoded with DCT-domain downscaling (the decode
// options kiln's build step uses). Prints "W H SCALE_NUM/SCALE_DENOM" (the
// output size and the DCT factor used). Exit 0 on success, 1 on any error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln/image/decode.h"
#include "kiln/image/transform.h"

namespace {

kiln::Status Run(const std::string& path, int resize, int crop, const std::string& out_path,
                 bool dct) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return kiln::Status::IOError(path + ": cannot open");
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  kiln::image::ResizeSpec spec;
  spec.resize_shorter = resize;
  spec.crop = crop;
  kiln::image::DecodeOptions options;
  if (dct) {
    int w, h;
    KILN_RETURN_IF_ERROR(kiln::image::ReadHeader(data.data(), data.size(), path, &w, &h));
    KILN_RETURN_IF_ERROR(
        kiln::image::PlanResize(w, h, spec, &options.min_width, &options.min_height));
  }
  kiln::image::ImageU8 decoded, result;
  KILN_RETURN_IF_ERROR(kiln::image::Decode(data.data(), data.size(), path, options, &decoded));
  KILN_RETURN_IF_ERROR(kiln::image::ResizeAndCrop(decoded, spec, &result));
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(result.pixels.data()),
            static_cast<std::streamsize>(result.pixels.size()));
  if (!out) return kiln::Status::IOError(out_path + ": cannot write");
  std::printf("%d %d %d/%d\n", result.width, result.height, decoded.scale_num, decoded.scale_denom);
  return kiln::Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 6 && std::strcmp(argv[5], "--dct") == 0)) {
    std::fprintf(stderr, "usage: %s IMAGE RESIZE CROP OUT.raw [--dct]\n", argv[0]);
    return 1;
  }
  kiln::Status status = Run(argv[1], std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argc == 6);
  if (!status.ok()) {
    std::fprintf(stderr, "kiln_resize_dump: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
