#include "pixels/simd.h"

#ifdef KILN_X86_SIMD
#include <cpuid.h>
#endif

namespace kiln {

const SimdFeatures& CpuSimd() {
  static const SimdFeatures features = [] {
    SimdFeatures f;
#ifdef KILN_X86_SIMD
    __builtin_cpu_init();
    f.sse41 = __builtin_cpu_supports("sse4.1");
    f.avx2 = __builtin_cpu_supports("avx2");
    // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
    // does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    f.fma = __builtin_cpu_supports("fma");
    f.avx512bw_vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vbmi");
#endif
    return f;
  }();
  return features;
}

}  // namespace kiln
