// kiln doctor's codec versions, with kiln::image built (doctor_codecs_none.cc
// without it: CMake picks the file).
#include "doctor.h"
#include "kiln/image/decode.h"

namespace kiln::tools {

std::vector<std::pair<std::string, std::string>> CodecLibraryVersions() {
  return image::CodecVersions();
}

}  // namespace kiln::tools
