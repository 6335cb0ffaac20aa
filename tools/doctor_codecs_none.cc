// kiln doctor without kiln::image (-DKILN_WITH_IMAGE=OFF): no codecs to report.
#include "doctor.h"

namespace kiln::tools {

std::vector<std::pair<std::string, std::string>> CodecLibraryVersions() { return {}; }

}  // namespace kiln::tools
