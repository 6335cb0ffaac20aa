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

uint64_t PageFloor(uintptr_t p) { return p / kPage * kPage; }

class KernelAdvisor final : public PageAdvisor {
 public:
  bool Resident(const uint8_t* p, uint64_t n) override {
    // In pieces of a fixed size: nothing is allocated per call.
    constexpr uint64_t kPieces = 64;
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

void SequentialReadAhead::Reached(const uint8_t* p) {
  if (p < begin_ || p > end_) begin_ = end_ = p;  // a new file, or a jump
  if (end_ - p >= static_cast<std::ptrdiff_t>(window_ / 2)) return;
  const uint8_t* until = p + window_;
  advisor_->WillNeed(end_, static_cast<uint64_t>(until - end_));
  end_ = until;
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
