#include "core/cpus.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace kiln {

int UsableCpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cpus);
}

bool CpuinfoHasNativeBf16(const std::string& cpuinfo) {
  std::istringstream lines(cpuinfo);
  std::string line;
  while (std::getline(lines, line)) {
    // "flags\t\t: fpu vme ... avx512_bf16 ..." (x86; one such line per CPU).
    if (line.compare(0, 5, "flags") != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream flags(line.substr(colon + 1));
    std::string f;
    while (flags >> f)
      if (f == "avx512_bf16" || f == "amx_bf16") return true;
    return false;  // the first CPU's flags decide (they are the same on every CPU)
  }
  return false;
}

bool CpuHasNativeBf16() {
  static const bool native = [] {
    std::ifstream in("/proc/cpuinfo");
    if (!in) return false;
    std::ostringstream text;
    text << in.rdbuf();
    return CpuinfoHasNativeBf16(text.str());
  }();
  return native;
}

}  // namespace kiln
