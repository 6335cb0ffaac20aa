// kiln_synth_cache DIR N C H W [float16|float32|uint8]: writes a cache of N
// records of shape CxHxW with deterministic pseudo-random payloads (finite
// floats) and labels i % 10, for benchmarks on machines that build kiln
// without its image part (the GPU machine: tools/gpu_check.sh).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/cache_writer.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 6) {
    std::fprintf(stderr, "usage: kiln_synth_cache DIR N C H W [float16|float32|uint8]\n");
    return 2;
  }
  const uint64_t n = std::strtoull(argv[2], nullptr, 10);
  WriterOptions o;
  o.shape.ndim = 3;
  for (int i = 0; i < 3; ++i) o.shape.dims[i] = static_cast<uint32_t>(std::atoi(argv[3 + i]));
  const std::string dtype = argc > 6 ? argv[6] : "float16";
  if (dtype == "float32") o.dtype = DType::kFloat32;
  else if (dtype == "uint8") o.dtype = DType::kUint8;
  else if (dtype != "float16") return std::fprintf(stderr, "unknown dtype %s\n", dtype.c_str()), 2;
  std::unique_ptr<CacheWriter> w;
  Status s = CacheWriter::Open(o, argv[1], &w);
  const size_t bytes = o.shape.NumElements() * DTypeSize(o.dtype);
  std::vector<uint8_t> p(bytes);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; s.ok() && i < n; ++i) {
    for (size_t b = 0; b < bytes; ++b) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      p[b] = static_cast<uint8_t>(x);
    }
    // float16 0x3c00-0x3cff and float32 with the top byte 0x3f: finite values near 1.
    if (o.dtype == DType::kFloat16)
      for (size_t b = 1; b < bytes; b += 2) p[b] = 0x3c;
    if (o.dtype == DType::kFloat32)
      for (size_t b = 3; b < bytes; b += 4) p[b] = 0x3f;
    s = w->Append(i, static_cast<int64_t>(i % 10), p.data());
  }
  Manifest m;
  for (int c = 0; c < 10; ++c) m.classes.push_back("class" + std::to_string(c));
  if (o.dtype == DType::kUint8)
    if (!kiln::Preprocessing::FromJson(R"({"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]})",
                                       "kiln_synth_cache", &m.preprocessing)
             .ok())
      return 2;
  if (s.ok()) s = w->Finish(&m);
  if (!s.ok()) {
    std::fprintf(stderr, "kiln_synth_cache: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("kiln_synth_cache: %llu records of %zu bytes in %s\n",
              static_cast<unsigned long long>(n), bytes, argv[1]);
  return 0;
}
