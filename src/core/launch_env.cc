#include "core/launch_env.h"

#include <cstdlib>
#include <string>

#include "core/decimal.h"

namespace kiln {

Status LaunchVariable(const char* name, long lo, long hi, long* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return Status::InvalidArgument(std::string(name) + " is not set");
  long n = 0;
  if (!ParseDecimal(v, &n) || n < lo || n > hi)
    return Status::InvalidArgument(std::string(name) + "=" + v + " is not a number in " +
                                   std::to_string(lo) + ".." + std::to_string(hi) +
                                   " (a launcher such as torchrun sets it)");
  *out = n;
  return Status::OK();
}

Status ReadLaunchEnvironment(LaunchEnvironment* out) {
  *out = LaunchEnvironment();
  if (std::getenv("LOCAL_RANK") != nullptr) {
    long local = 0;
    KILN_RETURN_IF_ERROR(LaunchVariable("LOCAL_RANK", 0, 1 << 16, &local));
    out->local_rank = static_cast<int>(local);
  }
  if (std::getenv("WORLD_SIZE") == nullptr) return Status::OK();
  long world = 0, rank = 0;
  KILN_RETURN_IF_ERROR(LaunchVariable("WORLD_SIZE", 1, 1 << 16, &world));
  if (world == 1) return Status::OK();
  KILN_RETURN_IF_ERROR(LaunchVariable("RANK", 0, world - 1, &rank));
  out->world = static_cast<int>(world);
  out->rank = static_cast<int>(rank);
  return Status::OK();
}

const std::vector<std::pair<std::string, std::string>>& TorchProcessEnvironment() {
  static const std::vector<std::pair<std::string, std::string>> env = {
      {"OMP_WAIT_POLICY", "PASSIVE"},
      {"GLIBC_TUNABLES",
       "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1099511627776"}};
  return env;
}

}  // namespace kiln
