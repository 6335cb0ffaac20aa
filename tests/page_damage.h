// Seeded damage to the LMDB page headers of a shard file, as a copy in
// transit might suffer it: the tests of every reader (C++, kiln bench,
// kiln.Loader through tests/damage_shard.cc) share this one generator.
#ifndef KILN_TESTS_PAGE_DAMAGE_H_
#define KILN_TESTS_PAGE_DAMAGE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::testing {

// One byte to write: its offset in the file and its new value.
struct ByteWrite {
  uint64_t offset;
  uint8_t value;
};

// 1-4 bytes for the first 64 bytes (a page's header and the start of its
// node array) of one page of the LMDB file `shard`, all drawn from
// std::mt19937_64(seed): the page uniformly from the file's pages (page
// size from meta page 0), then the count, then each byte's offset and
// value. The same seed gives the same bytes on any platform. *page gets
// the page's number.
std::vector<ByteWrite> PageHeaderDamage(const std::string& shard, uint64_t seed, uint64_t* page);

// Applies PageHeaderDamage(*shard, seed) to *shard; returns the page.
uint64_t DamagePageHeader(std::string* shard, uint64_t seed);

}  // namespace kiln::testing

#endif  // KILN_TESTS_PAGE_DAMAGE_H_
