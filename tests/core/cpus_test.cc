// The CPU facts kiln's defaults rest on: native bf16 (kiln train --precision auto).
#include "core/cpus.h"

#include <catch2/catch.hpp>

using namespace kiln;

TEST_CASE("native bf16 is read from the CPU flags of /proc/cpuinfo", "[core]") {
  const std::string head = "processor\t: 0\nvendor_id\t: AuthenticAMD\n";
  CHECK(CpuinfoHasNativeBf16(head + "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 rdpid\n"));
  CHECK(CpuinfoHasNativeBf16(head + "flags\t\t: fpu avx512f amx_tile amx_bf16\n"));
  CHECK(CpuinfoHasNativeBf16(head + "flags\t\t: avx512_bf16\n"));  // the first flag, the last
  // AVX-512 without BF16, AMX without its bf16 unit, look-alike names.
  CHECK_FALSE(CpuinfoHasNativeBf16(head + "flags\t\t: fpu avx2 avx512f avx512_vnni\n"));
  CHECK_FALSE(
      CpuinfoHasNativeBf16(head + "flags\t\t: amx_tile amx_int8 xavx512_bf16 avx512_bf16x\n"));
  // Only the flags line counts; another architecture's "bf16" feature is not x86's.
  CHECK_FALSE(CpuinfoHasNativeBf16("model name\t: avx512_bf16 lookalike\nflags\t\t: fpu\n"));
  CHECK_FALSE(CpuinfoHasNativeBf16("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"));
  CHECK_FALSE(CpuinfoHasNativeBf16(""));
}
