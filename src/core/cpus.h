// The CPUs this process may run on, for the libraries' thread counts and
// kiln doctor.
#ifndef KILN_CORE_CPUS_H_
#define KILN_CORE_CPUS_H_

namespace kiln {

// CPUs in this process's affinity mask (sched_getaffinity: what taskset,
// cpusets and `docker --cpuset-cpus` allow), at least 1; falls back to
// std::thread::hardware_concurrency() when the mask cannot be read.
int UsableCpus();

}  // namespace kiln

#endif  // KILN_CORE_CPUS_H_
