// The CPUs this process may run on, for the libraries' thread counts and
// kiln doctor, and the SIMD extensions kiln's kernels choose among.
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

// Defined where kiln compiles its x86-64 SIMD kernels (GCC or Clang target
// attributes); which of them run is CpuSimd's to say.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_X86_SIMD 1
#endif

// The x86-64 SIMD extensions kiln's image kernels use (resampling, the
// loader's normalization), as the CPU and the OS support them
// (__builtin_cpu_supports, which checks the OS saves the AVX/AVX-512
// state); all false on other architectures and compilers.
struct SimdFeatures {
  bool sse41 = false;
  bool avx2 = false, f16c = false, fma = false;
  bool avx512bw_vbmi = false;  // AVX-512 F, BW and VBMI together
};
// Detected once, on first use.
const SimdFeatures& CpuSimd();

}  // namespace kiln

#endif  // KILN_CORE_CPUS_H_
