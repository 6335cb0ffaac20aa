// One seeded shuffle for every place that needs a reproducible order or
// sample: the record order of kiln build --shuffle-seed, the images of
// --norm auto --stats-sample, the records deep verify re-checks.
//
// std::shuffle's algorithm differs between standard libraries (libstdc++,
// libc++), so the same seed would pick other images elsewhere; this one is
// specified here: Fisher-Yates from the back, with std::mt19937_64 (whose
// output the C++ standard fixes) and the index draw `rng() % i`.
#ifndef KILN_SHUFFLE_H_
#define KILN_SHUFFLE_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace kiln {

// Permutes `v` in place; the same seed gives the same order everywhere.
template <typename T>
void SeededShuffle(std::vector<T>* v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v->size(); i > 1; --i) std::swap((*v)[i - 1], (*v)[rng() % i]);
}

// `k` of the indices 0..n-1 chosen with `seed`, in increasing order; all of
// them when k == 0 or k >= n.
inline std::vector<size_t> SeededSample(size_t n, uint64_t k, uint64_t seed) {
  std::vector<size_t> pick(n);
  std::iota(pick.begin(), pick.end(), size_t{0});
  if (k == 0 || k >= n) return pick;
  SeededShuffle(&pick, seed);
  pick.resize(static_cast<size_t>(k));
  std::sort(pick.begin(), pick.end());
  return pick;
}

}  // namespace kiln

#endif  // KILN_SHUFFLE_H_
