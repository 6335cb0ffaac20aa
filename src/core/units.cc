#include "kiln/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace kiln {

Status ParseByteSize(const std::string& text, const std::string& option, uint64_t* out) {
  const Status bad = Status::InvalidArgument(
      option + " '" + text +
      "': expected a size such as 512M, 4G, 4GB or 1.5GiB (K, M, G, T and KiB..TiB are powers "
      "of 1024; KB..TB powers of 1000)");
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(v > 0) || !std::isfinite(v)) return bad;
  const std::string unit = end;
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},         {"B", 1},        {"K", 0x1p10},   {"k", 0x1p10},   {"M", 0x1p20},
      {"m", 0x1p20},   {"G", 0x1p30},   {"g", 0x1p30},   {"T", 0x1p40},   {"t", 0x1p40},
      {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}, {"KB", 1e3},
      {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12}};
  for (const auto& [name, mult] : kUnits) {
    if (unit != name) continue;
    const double bytes = v * mult;
    if (bytes < 1 || bytes >= 0x1p64) return bad;
    *out = static_cast<uint64_t>(bytes);
    return Status::OK();
  }
  return bad;
}

std::string FormatByteSize(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace kiln
