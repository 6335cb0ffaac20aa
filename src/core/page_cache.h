// The page cache under a cache's shards (internal): which of their bytes
// are in memory, asking the kernel to read bytes ahead, evicting them, and
// how much memory there is for them.
//
// Used by the loader's read-ahead (core/loader.cc), kiln bench --cold, kiln
// doctor and inspect, and the tests. Linux only, as kiln is.
#ifndef KILN_SRC_CORE_PAGE_CACHE_H_
#define KILN_SRC_CORE_PAGE_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/cache_reader.h"
#include "kiln/status.h"

namespace kiln {

// How read-ahead talks to the kernel about mapped file bytes. One object
// per thread that uses it. A test replaces it to count what is asked.
class PageAdvisor {
 public:
  virtual ~PageAdvisor() = default;
  // Whether every page of [p, p+n) is in the page cache (mincore(2)).
  virtual bool Resident(const uint8_t* p, uint64_t n) = 0;
  // Starts reading the pages of [p, p+n) into the page cache and returns
  // without waiting for them (madvise(MADV_WILLNEED), in pieces no larger
  // than the kernel reads ahead in one request).
  virtual void WillNeed(const uint8_t* p, uint64_t n) = 0;
};

// For a pass that reads a mapped file from start to end (kiln verify, the
// duplicate scan): keeps the next `window` bytes past the place the pass
// has reached requested from the disk, so that a cold shard is read at
// the disk's sequential speed rather than a page per fault. Works on any
// mapping (a shared LMDB map's advice is left alone). One per pass.
class SequentialReadAhead {
 public:
  explicit SequentialReadAhead(uint64_t window = uint64_t{64} << 20);
  // The pass has reached `p`; asks for more when less than half the window
  // is left ahead of it. A jump backwards starts over from `p`.
  void Reached(const uint8_t* p);

 private:
  std::unique_ptr<PageAdvisor> advisor_;
  uint64_t window_;
  const uint8_t* begin_ = nullptr;  // [begin_, end_) has been asked for
  const uint8_t* end_ = nullptr;
};

// The kernel's advisor, or what the test factory makes.
std::unique_ptr<PageAdvisor> MakePageAdvisor();
// The kernel's advisor always.
std::unique_ptr<PageAdvisor> MakeKernelPageAdvisor();
// For tests: MakePageAdvisor returns factory() while set; empty restores.
void SetPageAdvisorFactoryForTesting(std::function<std::unique_ptr<PageAdvisor>()> factory);

// Bytes of memory this process can fill with page cache before it evicts
// what it read: MemAvailable, and the memory cgroup's limit when one is set
// (cgroup v1 memory.limit_in_bytes, v2 memory.max). 0 when neither can be
// read.
uint64_t AvailableMemoryBytes();

// This process's memory cgroup limit in bytes (v1 memory.limit_in_bytes,
// v2 memory.max), 0 when there is none.
uint64_t CgroupMemoryLimit();

// The read-ahead budget of LoaderOptions::readahead_bytes = kAutoReadAhead:
// 256 MiB, or a quarter of AvailableMemoryBytes() when that is less (read
// ahead further than memory holds and the bytes are evicted before use).
uint64_t DefaultReadAheadBytes();

// The fraction (0..1) of the bytes of the reader's shard files in the page
// cache now.
Status ResidentFraction(const CacheReader& reader, double* fraction);

// Drops the reader's shard files from the page cache, as a cache copied to
// another machine or evicted by other jobs would be: this process's
// mappings of them are unmapped page by page (MADV_DONTNEED: a mapped page
// cannot be dropped), then the files' pages are dropped
// (posix_fadvise(POSIX_FADV_DONTNEED)); no root needed. Pages that another
// process maps or that are dirty stay; *resident_after says what remains.
Status EvictFromPageCache(const CacheReader& reader, double* resident_after);

}  // namespace kiln

#endif  // KILN_SRC_CORE_PAGE_CACHE_H_
