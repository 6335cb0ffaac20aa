// What the loader's tests share (loader_test.cc, read_ahead_test.cc): a ring
// of batch slots in ordinary memory, and a loader over it.
#ifndef KILN_TESTS_CORE_LOADER_FIXTURE_H_
#define KILN_TESTS_CORE_LOADER_FIXTURE_H_

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/loader.h"

namespace kiln::testing {

struct Ring {
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<int64_t>> labels;
  std::vector<BatchSlot> slots;
  Ring(int k, uint64_t batch, uint64_t sample_bytes) : data(k), labels(k) {
    for (int i = 0; i < k; ++i) {
      data[i].resize(batch * sample_bytes);
      labels[i].resize(batch);
      slots.push_back({data[i].data(), labels[i].data()});
    }
  }
};

// A loader over `ring`; the test fails if Open does.
inline std::unique_ptr<Loader> MakeLoader(const CacheReader* r, const LoaderOptions& o,
                                          Ring* ring) {
  std::unique_ptr<Loader> l;
  Status s = Loader::Open(r, o, ring->slots, &l);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return l;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_CORE_LOADER_FIXTURE_H_
