// The x86-64 SIMD extensions kiln's pixel kernels choose among at run time
// (the resampler, the loader's normalization), below every other module.
#ifndef KILN_SRC_PIXELS_SIMD_H_
#define KILN_SRC_PIXELS_SIMD_H_

namespace kiln {

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

#endif  // KILN_SRC_PIXELS_SIMD_H_
