// kiln verify --level sources|deep in a kiln built without kiln::ingest
// (KILN_WITH_IMAGE=OFF): says so. cmd_build.cc defines it otherwise.
#include "command.h"

namespace kiln::tools {

Status VerifySources(const std::string&, const std::string& level, const VerifyOptions&, uint64_t,
                     uint64_t, VerifyReport*) {
  return Status::NotSupported("level '" + level +
                              "' needs kiln's image component (built with KILN_WITH_IMAGE=ON); "
                              "use quick or full");
}

}  // namespace kiln::tools
