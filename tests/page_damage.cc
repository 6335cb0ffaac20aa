#include "page_damage.h"

#include <cstring>
#include <random>

namespace kiln::testing {

std::vector<ByteWrite> PageHeaderDamage(const std::string& shard, uint64_t seed, uint64_t* page) {
  // MDB_meta's page size, 24 bytes into the meta data after the 16-byte
  // page header; 4096 (x86-64 Linux) if the file is too short to say.
  uint32_t psize = 4096;
  if (shard.size() >= 44) std::memcpy(&psize, shard.data() + 40, sizeof psize);
  const uint64_t pages = psize ? shard.size() / psize : 0;
  *page = 0;
  if (pages == 0) return {};
  std::mt19937_64 rng(seed);
  *page = rng() % pages;
  std::vector<ByteWrite> writes(1 + rng() % 4);
  for (ByteWrite& w : writes) {
    w.offset = *page * psize + rng() % 64;
    w.value = static_cast<uint8_t>(rng() & 0xff);
  }
  return writes;
}

uint64_t DamagePageHeader(std::string* shard, uint64_t seed) {
  uint64_t page = 0;
  for (const ByteWrite& w : PageHeaderDamage(*shard, seed, &page))
    (*shard)[w.offset] = static_cast<char>(w.value);
  return page;
}

}  // namespace kiln::testing
