#include "core/cpus.h"

#include <sched.h>

#include <algorithm>
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

}  // namespace kiln
