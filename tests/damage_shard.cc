// kiln_damage_shard SHARD FIRST_SEED COUNT: prints, for each seed from
// FIRST_SEED on, the bytes PageHeaderDamage (page_damage.h) would write into
// the LMDB shard file SHARD, one line per seed:
//   SEED PAGE OFFSET:VALUE...
// (decimal), for the Python tests of readers on damaged caches, which apply
// them to copies: one generator for every test, and one process per run.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "page_damage.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kiln_damage_shard SHARD FIRST_SEED COUNT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (!in || bytes.empty()) {
    std::fprintf(stderr, "kiln_damage_shard: cannot read %s\n", argv[1]);
    return 1;
  }
  const uint64_t first = std::strtoull(argv[2], nullptr, 10);
  const uint64_t count = std::strtoull(argv[3], nullptr, 10);
  for (uint64_t seed = first; seed < first + count; ++seed) {
    uint64_t page = 0;
    const auto writes = kiln::testing::PageHeaderDamage(bytes, seed, &page);
    std::printf("%llu %llu", static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(page));
    for (const auto& w : writes)
      std::printf(" %llu:%u", static_cast<unsigned long long>(w.offset), w.value);
    std::printf("\n");
  }
  return 0;
}
