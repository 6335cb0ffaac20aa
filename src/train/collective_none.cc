// Collective for a kiln built without a c10d backend: one process only.
#include <cstdlib>
#include <string>

#include "collective.h"

namespace kiln::train {

Status JoinFromEnvironment(int /*timeout_seconds*/, std::unique_ptr<Collective>* out,
                           std::string* description) {
  out->reset();
  description->clear();
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr || std::string(world) == "1") return Status::OK();
  return Status::NotSupported(std::string("WORLD_SIZE=") + world +
                              ": this kiln was built without c10d's Gloo backend (Gloo's headers, "
                              "libgloo-dev, were not found), so it trains in one process only");
}

}  // namespace kiln::train
