// The page cache under a cache's shards (internal): which of their bytes
// are in memory, asking the kernel to read bytes ahead, evicting them, and
// how much memory there is for them.
//
// Used by the loader's read-ahead (core/loader.cc), kiln bench --cold, kiln
// doctor and inspect, and the tests. Linux only, as kiln is.
#ifndef KILN_SRC_CORE_PAGE_CACHE_H_
#define KILN_SRC_CORE_PAGE_CACHE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

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
  // Maps the pages of [p, p+n) into this process, reading those not in the
  // page cache and waiting for them (madvise(MADV_POPULATE_READ), Linux
  // 5.14), without a fault per page. On a MADV_RANDOM map (LMDB's) a page
  // not in memory is read a page at a time. False where the kernel has no
  // such advice; bytes past the file's end are no error.
  virtual bool Populate(const uint8_t* p, uint64_t n) {
    (void)p;
    (void)n;
    return false;
  }
};

// For a pass that reads a mapped file from start to end (kiln verify, the
// duplicate scan, the merge's copy): keeps the next `window` bytes past the
// place the pass has reached asked of the disk (PageAdvisor::WillNeed), so
// that a cold shard is read at the disk's sequential speed rather than a
// page per fault. A thread of its own then maps the asked bytes that are
// in memory into this process, a piece at a time, starting at the pass
// where it has fallen behind (PageAdvisor::Populate), so that the pass,
// and the threads it hands the bytes to, take no fault per page (a warm
// `kiln verify`: bench/verify_bench.sh). Works on any mapping (a shared LMDB
// map's advice is left alone); the mapping must outlive the object (the
// destructor waits for the piece in progress). One per pass; Reached is
// called from one thread.
//
// `end` is where the mapped file's bytes end: nothing at or past it is
// asked for or mapped (past it may lie another mapping). Where the caller
// cannot say (nullptr), only WillNeed is asked, as advice is harmless
// anywhere.
class SequentialReadAhead {
 public:
  explicit SequentialReadAhead(uint64_t window = uint64_t{64} << 20);
  ~SequentialReadAhead();
  SequentialReadAhead(const SequentialReadAhead&) = delete;
  SequentialReadAhead& operator=(const SequentialReadAhead&) = delete;
  // The pass has reached `p`, in a mapped file that ends at `end`; asks for
  // more when less than half the window is left ahead of it. A jump (to
  // another file, or backwards) starts over from `p`.
  void Reached(const uint8_t* p, const uint8_t* end);

 private:
  void Ask(const uint8_t* from, const uint8_t* until, bool jump, bool populate);
  void Work();

  std::unique_ptr<PageAdvisor> advisor_;         // the caller's thread's
  std::unique_ptr<PageAdvisor> worker_advisor_;  // the worker's
  uint64_t window_;
  const uint8_t* begin_ = nullptr;  // [begin_, end_) has been asked for
  const uint8_t* end_ = nullptr;
  const uint8_t* file_end_ = nullptr;  // the `end` of the last Reached
  // Shared with the worker, under mu_: [at_, until_) is still to map;
  // kernel_populates_ turns false where Populate cannot. reached_ (atomic:
  // stored at every Reached) is where the pass is, in the same file as at_
  // once Ask has switched files.
  std::mutex mu_;
  std::condition_variable cv_;
  const uint8_t* at_ = nullptr;
  const uint8_t* until_ = nullptr;
  bool kernel_populates_ = true;
  std::atomic<const uint8_t*> reached_{nullptr};
  bool stop_ = false;
  std::thread worker_;
};

// Where the shard file of `reader` whose mapping holds a pointer ends (for
// SequentialReadAhead::Reached): the shards are looked up again only when
// a pointer leaves the file found last.
class MappedFileEnds {
 public:
  explicit MappedFileEnds(const CacheReader& reader) : reader_(reader) {}
  // nullptr where no mapping of the reader's holds p (a copy, a map kiln
  // could not find).
  const uint8_t* Of(const uint8_t* p);

 private:
  const CacheReader& reader_;
  const uint8_t* begin_ = nullptr;
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
