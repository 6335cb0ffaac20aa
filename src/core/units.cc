#include "core/units.h"

#include <ctime>

#include <algorithm>
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

std::string FormatDuration(double seconds) {
  const double s = seconds > 0 ? seconds : 0;  // NaN too
  char buf[48];
  // Each bound is where the next format's rounding would show one more
  // digit than its precision ("1000 ms" becomes "1.00 s").
  if (s < 0.00995) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", s * 1e3);
  } else if (s < 0.9995) {
    std::snprintf(buf, sizeof(buf), "%.0f ms", s * 1e3);
  } else if (s < 9.995) {
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
  } else if (s < 59.95) {
    std::snprintf(buf, sizeof(buf), "%.1f s", s);
  } else if (s < 3599.5) {
    const long long t = std::llround(s);
    std::snprintf(buf, sizeof(buf), "%lld min %02lld s", t / 60, t % 60);
  } else {
    const double minutes = std::min(s / 60, 1e15);  // far beyond any run; keeps llround defined
    const long long t = std::llround(minutes);
    std::snprintf(buf, sizeof(buf), "%lld h %02lld min", t / 60, t % 60);
  }
  return buf;
}

std::string FormatByteRate(double bytes, double seconds) {
  return seconds > 0 ? FormatByteSize(bytes / seconds) + "/s" : std::string();
}

std::string UtcNowIso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return when;
}

}  // namespace kiln
