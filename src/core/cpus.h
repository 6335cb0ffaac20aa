// The CPUs this process may run on, for the libraries' thread counts and
// kiln doctor (the SIMD extensions kiln's kernels choose among are
// pixels/simd.h's).
#ifndef KILN_CORE_CPUS_H_
#define KILN_CORE_CPUS_H_

#include <string>

namespace kiln {

// CPUs in this process's affinity mask (sched_getaffinity: what taskset,
// cpusets and `docker --cpuset-cpus` allow), at least 1; falls back to
// std::thread::hardware_concurrency() when the mask cannot be read.
int UsableCpus();

// Whether the CPU computes bf16 products natively: x86's AVX512-BF16 or
// AMX-BF16, as the kernel lists them in /proc/cpuinfo ("avx512_bf16",
// "amx_bf16" among the flags; a flag the kernel cleared, say for an OS
// without AVX-512 state, is absent there). oneDNN then runs bf16
// convolutions and matrix products about twice as fast as fp32; without
// these instructions it emulates bf16, slower than fp32. False where the
// file cannot be read or on other architectures.
bool CpuHasNativeBf16();
// The rule of CpuHasNativeBf16 applied to the text of a /proc/cpuinfo.
bool CpuinfoHasNativeBf16(const std::string& cpuinfo);

}  // namespace kiln

#endif  // KILN_CORE_CPUS_H_
