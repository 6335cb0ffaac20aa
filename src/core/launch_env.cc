#include "core/launch_env.h"

#include <cstdlib>
#include <string>

#include "core/decimal.h"

namespace kiln {
namespace {

// Variable `name` as a decimal number in lo..hi; *present false when unset.
Status EnvInt(const char* name, long lo, long hi, bool* present, int* out) {
  const char* v = std::getenv(name);
  *present = v != nullptr;
  if (v == nullptr) return Status::OK();
  uint64_t n = 0;
  if (!ParseDecimal(v, &n) || n < static_cast<uint64_t>(lo) || n > static_cast<uint64_t>(hi))
    return Status::InvalidArgument(std::string(name) + "=" + v + " is not a number in " +
                                   std::to_string(lo) + ".." + std::to_string(hi) +
                                   " (a launcher such as torchrun sets it)");
  *out = static_cast<int>(n);
  return Status::OK();
}

}  // namespace

Status ReadLaunchEnvironment(LaunchEnvironment* out) {
  *out = LaunchEnvironment();
  bool world_set = false, rank_set = false, local_set = false;
  int world = 1, rank = 0, local = 0;
  KILN_RETURN_IF_ERROR(EnvInt("WORLD_SIZE", 1, 1 << 16, &world_set, &world));
  if (!world_set) return Status::OK();
  KILN_RETURN_IF_ERROR(EnvInt("RANK", 0, world - 1, &rank_set, &rank));
  if (!rank_set && world > 1)
    return Status::InvalidArgument("WORLD_SIZE=" + std::to_string(world) +
                                   " but RANK is not set (a launcher such as torchrun sets both)");
  KILN_RETURN_IF_ERROR(EnvInt("LOCAL_RANK", 0, world - 1, &local_set, &local));
  out->launched = true;
  out->world_size = world;
  out->rank = rank;
  out->local_rank = local;
  return Status::OK();
}

}  // namespace kiln
