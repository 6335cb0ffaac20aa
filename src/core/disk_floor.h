// What the disk under a cache can deliver (internal, for kiln bench --cold):
// the physical floors a cold epoch is compared with, measured in the same
// run. Each measurement first evicts the shards from the page cache
// (core/page_cache.h) so that every byte comes from the disk.
#ifndef KILN_SRC_CORE_DISK_FLOOR_H_
#define KILN_SRC_CORE_DISK_FLOOR_H_

#include <cstdint>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/status.h"

namespace kiln {

struct DiskFloor {
  double seconds = 0;
  uint64_t bytes = 0;          // read from the shard files
  uint64_t reads = 0;          // records read (random) or 0 (sequential)
  double resident_before = 0;  // page-cache fraction left after the eviction
  double bytes_per_s() const { return seconds > 0 ? bytes / seconds : 0; }
  double reads_per_s() const { return seconds > 0 ? reads / seconds : 0; }
};

// Every shard file read once from start to end with 8 MiB pread()s, one
// shard after the other: the disk's sequential speed (what `cat` gets).
Status MeasureSequentialRead(const CacheReader& reader, DiskFloor* out);

// `threads` threads pread() records' stored values (header and payload, at
// their places in the shard files) in the order `indices`, up to `reads`
// records: the disk's speed for record-sized random reads at that depth,
// which a cold epoch in shuffled order cannot beat without reading whole
// shards.
Status MeasureRandomReads(const CacheReader& reader, const std::vector<uint64_t>& indices,
                          int threads, uint64_t reads, DiskFloor* out);

}  // namespace kiln

#endif  // KILN_SRC_CORE_DISK_FLOOR_H_
