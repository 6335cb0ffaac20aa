// The loader's physical floor (internal, for kiln's own benchmarks: kiln
// bench and kiln-train bench): not part of the library's API.
#ifndef KILN_SRC_CORE_MEMCPY_FLOOR_H_
#define KILN_SRC_CORE_MEMCPY_FLOOR_H_

#include <cstdint>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/status.h"

namespace kiln {

// The physical floor of a loader, for benchmarks: `threads` threads memcpy
// the records of `order` from the memory map, batch by batch into `ring`
// (the caller's buffers, each at least batch x record bytes: pass the
// loader's own slots, so that the floor costs no memory of its own), as a
// loader's workers would; nothing else. Sets *samples_per_s to the best of
// `reps` runs. Returns the Status of a record that cannot be read.
Status MeasureMemcpyFloor(const CacheReader* reader, const std::vector<uint64_t>& order,
                          uint64_t batch, int threads, const std::vector<void*>& ring, int reps,
                          double* samples_per_s);

}  // namespace kiln

#endif  // KILN_SRC_CORE_MEMCPY_FLOOR_H_
