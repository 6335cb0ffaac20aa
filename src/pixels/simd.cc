#include "pixels/simd.h"

namespace kiln {

const SimdFeatures& CpuSimd() {
  static const SimdFeatures features = [] {
    SimdFeatures f;
#ifdef KILN_X86_SIMD
    __builtin_cpu_init();
    f.sse41 = __builtin_cpu_supports("sse4.1");
    f.avx2 = __builtin_cpu_supports("avx2");
    f.f16c = __builtin_cpu_supports("f16c");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512bw_vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vbmi");
#endif
    return f;
  }();
  return features;
}

}  // namespace kiln
