#include "core/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kiln {
namespace {

constexpr uint64_t kPage = 4096;
// The most one MADV_WILLNEED call reads ahead is the larger of the device's
// largest request and its read-ahead window (mm/readahead.c,
// force_page_cache_ra); 512 KiB is within both on common devices (a window
// of 128 KiB with requests of 512 KiB or more).
constexpr uint64_t kWillNeedPiece = 512 << 10;

// SequentialReadAhead's unit: a piece is asked of the disk or mapped whole,
// and a stop or a jump waits for one piece only.
constexpr uint64_t kMapPiece = uint64_t{2} << 20;

uint64_t PageFloor(uintptr_t p) { return p / kPage * kPage; }

class KernelAdvisor final : public PageAdvisor {
 public:
  bool Resident(const uint8_t* p, uint64_t n) override {
    // In pieces of a fixed size: nothing is allocated per call.
    constexpr uint64_t kPieces = 512;  // 2 MiB of pages a call
    unsigned char vec[kPieces];
    uintptr_t at = PageFloor(reinterpret_cast<uintptr_t>(p));
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    while (at < end) {
      const uint64_t len = std::min<uint64_t>(kPieces * kPage, end - at);
      if (mincore(reinterpret_cast<void*>(at), len, vec) != 0) return false;
      for (uint64_t i = 0; i < (len + kPage - 1) / kPage; ++i)
        if ((vec[i] & 1) == 0) return false;
      at += len;
    }
    return true;
  }
  void WillNeed(const uint8_t* p, uint64_t n) override {
    uintptr_t at = PageFloor(reinterpret_cast<uintptr_t>(p));
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    while (at < end) {
      const uint64_t piece = std::min<uint64_t>(kWillNeedPiece, end - at);
      // Advice only: a failure (ENOMEM past the map) costs nothing but speed.
      (void)madvise(reinterpret_cast<void*>(at), piece, MADV_WILLNEED);
      at += piece;
    }
  }
  bool Populate(const uint8_t* p, uint64_t n) override {
#ifdef MADV_POPULATE_READ
    const uintptr_t at = PageFloor(reinterpret_cast<uintptr_t>(p));
    const uintptr_t len = reinterpret_cast<uintptr_t>(p) + n - at;
    if (madvise(reinterpret_cast<void*>(at), len, MADV_POPULATE_READ) == 0) return true;
    // EINVAL: a kernel before 5.14. EFAULT (past the file's end), ENOMEM
    // (not mapped) and the rest: nothing more to read here.
    return errno != EINVAL;
#else
    (void)p;
    (void)n;
    return false;
#endif
  }
};

std::function<std::unique_ptr<PageAdvisor>()>& TestFactory() {
  static std::function<std::unique_ptr<PageAdvisor>()> factory;
  return factory;
}

// A number from the first line of `path`; false when it is missing or not a
// number ("max" in cgroup v2 means no limit).
bool ReadNumber(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *out = std::stoull(text);
  return true;
}

// The memory limit of this process's cgroup (v1 or v2), or 0 for none.
uint64_t CgroupLimitOf() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  uint64_t limit = 0;
  while (std::getline(in, line)) {
    // "ID:CONTROLLERS:PATH"; v1 names "memory", v2 has the empty list.
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::vector<std::string> files;
    if (controllers == "memory") {
      files = {"/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"};
    } else if (controllers.empty()) {
      files = {"/sys/fs/cgroup" + path + "/memory.max",
               "/sys/fs/cgroup/unified" + path + "/memory.max"};
    }
    for (const std::string& f : files) {
      uint64_t v = 0;
      // v1 writes "no limit" as a page-rounded 2^63 - 1.
      if (ReadNumber(f, &v) && v < (uint64_t{1} << 62)) limit = limit ? std::min(limit, v) : v;
    }
  }
  return limit;
}

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Calls fn(mapping) for every shard.
template <typename Fn>
void ForEachShard(const CacheReader& reader, Fn fn) {
  for (size_t i = 0; i < reader.manifest().shards.size(); ++i)
    fn(reader.mapping(static_cast<int>(i)));
}

}  // namespace

std::unique_ptr<PageAdvisor> MakePageAdvisor() {
  if (TestFactory()) return TestFactory()();
  return MakeKernelPageAdvisor();
}

std::unique_ptr<PageAdvisor> MakeKernelPageAdvisor() { return std::make_unique<KernelAdvisor>(); }

void SetPageAdvisorFactoryForTesting(std::function<std::unique_ptr<PageAdvisor>()> factory) {
  TestFactory() = std::move(factory);
}

SequentialReadAhead::SequentialReadAhead(uint64_t window)
    : advisor_(MakePageAdvisor()), window_(window) {}

SequentialReadAhead::~SequentialReadAhead() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  worker_.join();
}

void SequentialReadAhead::Reached(const uint8_t* p, const uint8_t* end) {
  const bool jump = end != file_end_ || p < begin_ || p > end_;  // another file, or a jump
  if (jump) {
    begin_ = end_ = p;
    file_end_ = end;
  } else {
    reached_.store(p, std::memory_order_relaxed);
  }
  if (end_ - p >= static_cast<std::ptrdiff_t>(window_ / 2)) return;
  const bool bounded = end != nullptr && p < end;
  const uint8_t* until = bounded ? std::min(p + window_, end) : p + window_;
  if (until <= end_) return;  // the file's end is asked for already
  Ask(end_, until, jump, bounded);
  end_ = until;
}

void SequentialReadAhead::Ask(const uint8_t* from, const uint8_t* until, bool jump, bool populate) {
  // Asked of the disk here, at once: from a thread of its own a cold pass
  // ran slower (measured: bench/verify_bench.sh). Bytes in memory are not
  // asked (the kernel would look up every page of them again).
  if (!populate) {
    advisor_->WillNeed(from, static_cast<uint64_t>(until - from));
    return;
  }
  for (const uint8_t* at = from; at < until; at += kMapPiece) {
    const uint64_t n = std::min<uint64_t>(kMapPiece, static_cast<uint64_t>(until - at));
    if (!advisor_->Resident(at, n)) advisor_->WillNeed(at, n);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!kernel_populates_) return;
    // Contiguous with what is still to map: the range grows; after a jump
    // (or once all was mapped) it starts again where the pass is.
    if (jump || at_ >= until_) at_ = from;
    until_ = until;
    if (jump) reached_.store(from, std::memory_order_relaxed);
  }
  if (!worker_.joinable()) {
    worker_advisor_ = MakePageAdvisor();
    worker_ = std::thread([this] { Work(); });
  }
  cv_.notify_one();
}

void SequentialReadAhead::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || at_ < until_; });
    if (stop_) return;
    // Behind the pass: the bytes it has passed are mapped already.
    const uint8_t* pass = reached_.load(std::memory_order_relaxed);
    if (at_ < pass) at_ = std::min(pass, until_);
    if (at_ >= until_) continue;
    const uint8_t* from = at_;
    const uint64_t n = std::min<uint64_t>(kMapPiece, static_cast<uint64_t>(until_ - at_));
    at_ += n;
    lock.unlock();
    // Only a piece in memory: populating a cold one would read it a page
    // per fault, as LMDB's maps are MADV_RANDOM (MDB_NORDAHEAD), which
    // turns the kernel's read-around off; the WillNeed above reads it.
    bool supported = true;
    if (worker_advisor_->Resident(from, n)) supported = worker_advisor_->Populate(from, n);
    lock.lock();
    if (!supported) {
      kernel_populates_ = false;
      at_ = until_;
    }
  }
}

const uint8_t* MappedFileEnds::Of(const uint8_t* p) {
  if (p >= begin_ && p < end_) return end_;
  begin_ = end_ = nullptr;
  for (size_t i = 0; i < reader_.manifest().shards.size(); ++i) {
    const CacheReader::Mapping m = reader_.mapping(static_cast<int>(i));
    if (m.base != nullptr && p >= m.base && p < m.base + m.file_bytes) {
      begin_ = m.base;
      end_ = m.base + m.file_bytes;
      break;
    }
  }
  return end_;
}

uint64_t CgroupMemoryLimit() { return CgroupLimitOf(); }

uint64_t AvailableMemoryBytes() {
  const uint64_t avail = MemAvailable(), limit = CgroupMemoryLimit();
  if (avail == 0) return limit;
  return limit ? std::min(avail, limit) : avail;
}

uint64_t DefaultReadAheadBytes() {
  constexpr uint64_t kMost = uint64_t{256} << 20;
  const uint64_t avail = AvailableMemoryBytes();
  return avail ? std::min(kMost, avail / 4) : kMost;
}

Status ResidentFraction(const CacheReader& reader, double* fraction) {
  constexpr uint64_t kChunk = uint64_t{64} << 20;  // mincore's answer in 16 KiB pieces
  std::vector<unsigned char> vec(kChunk / kPage);
  uint64_t total = 0, resident = 0;
  Status status;
  ForEachShard(reader, [&](const CacheReader::Mapping& m) {
    if (!status.ok() || m.file_bytes == 0) return;
    // LMDB's own map, or (where kiln could not find it) a map of our own:
    // mincore answers for the file's pages in the page cache either way.
    const uint8_t* base = m.base;
    void* own = nullptr;
    if (base == nullptr) {
      const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) own = mmap(nullptr, m.file_bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (fd >= 0) ::close(fd);
      if (own == nullptr || own == MAP_FAILED) {
        status = Status::IOError(m.path + ": cannot map: " + std::strerror(errno));
        return;
      }
      base = static_cast<const uint8_t*>(own);
    }
    const uint64_t pages = (m.file_bytes + kPage - 1) / kPage;
    total += pages;
    for (uint64_t at = 0; at < m.file_bytes && status.ok(); at += kChunk) {
      const uint64_t len = std::min(kChunk, m.file_bytes - at);
      if (mincore(const_cast<uint8_t*>(base) + at, len, vec.data()) != 0) {
        status = Status::IOError(m.path + ": mincore: " + std::strerror(errno));
        break;
      }
      const uint64_t n = (len + kPage - 1) / kPage;
      for (uint64_t i = 0; i < n; ++i) resident += vec[i] & 1;
    }
    if (own != nullptr) munmap(own, m.file_bytes);
  });
  KILN_RETURN_IF_ERROR(status);
  *fraction = total ? static_cast<double>(resident) / total : 1.0;
  return Status::OK();
}

Status EvictFromPageCache(const CacheReader& reader, double* resident_after) {
  Status status;
  ForEachShard(reader, [&](const CacheReader::Mapping& m) {
    if (!status.ok()) return;
    const uint64_t len = (m.file_bytes + kPage - 1) / kPage * kPage;
    if (len > 0 && m.base != nullptr &&
        madvise(const_cast<uint8_t*>(m.base), len, MADV_DONTNEED) != 0) {
      status = Status::IOError(m.path + ": madvise(MADV_DONTNEED): " + std::strerror(errno));
      return;
    }
    const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      status = Status::IOError(m.path + ": cannot open: " + std::strerror(errno));
      return;
    }
    const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0) status = Status::IOError(m.path + ": posix_fadvise: " + std::strerror(rc));
  });
  KILN_RETURN_IF_ERROR(status);
  return ResidentFraction(reader, resident_after);
}

}  // namespace kiln
