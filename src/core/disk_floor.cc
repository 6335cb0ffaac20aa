#include "core/disk_floor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/page_cache.h"

namespace kiln {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The shard files opened for reading; closed when this goes.
class ShardFiles {
 public:
  Status Open(const CacheReader& reader) {
    for (size_t i = 0; i < reader.manifest().shards.size(); ++i) {
      const CacheReader::Mapping m = reader.mapping(static_cast<int>(i));
      const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Status::IOError(m.path + ": cannot open: " + std::strerror(errno));
      fds_.push_back(fd);
      paths_.push_back(m.path);
      sizes_.push_back(m.file_bytes);
    }
    return Status::OK();
  }
  ~ShardFiles() {
    for (int fd : fds_) ::close(fd);
  }
  size_t size() const { return fds_.size(); }
  int fd(size_t i) const { return fds_[i]; }
  const std::string& path(size_t i) const { return paths_[i]; }
  uint64_t bytes(size_t i) const { return sizes_[i]; }

 private:
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> sizes_;
};

// Reads `n` bytes at `offset` fully; a short file is an IOError.
Status ReadFully(int fd, const std::string& path, uint8_t* buf, uint64_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return Status::IOError(path + ": read at " + std::to_string(offset) + ": " +
                             (got < 0 ? std::strerror(errno) : "end of file"));
    buf += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status::OK();
}

}  // namespace

Status MeasureSequentialRead(const CacheReader& reader, DiskFloor* out) {
  *out = DiskFloor();
  ShardFiles files;
  KILN_RETURN_IF_ERROR(files.Open(reader));
  KILN_RETURN_IF_ERROR(EvictFromPageCache(reader, &out->resident_before));
  constexpr uint64_t kChunk = uint64_t{8} << 20;
  std::vector<uint8_t> buf(kChunk);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < files.size(); ++i) {
    for (uint64_t at = 0; at < files.bytes(i); at += kChunk) {
      const uint64_t n = std::min(kChunk, files.bytes(i) - at);
      KILN_RETURN_IF_ERROR(ReadFully(files.fd(i), files.path(i), buf.data(), n, at));
      out->bytes += n;
    }
  }
  out->seconds = Since(t0);
  return Status::OK();
}

Status MeasureRandomReads(const CacheReader& reader, const std::vector<uint64_t>& indices,
                          int threads, uint64_t reads, DiskFloor* out) {
  *out = DiskFloor();
  reads = std::min<uint64_t>(reads, indices.size());
  if (reads == 0 || threads < 1) return Status::OK();
  // Where each record lies, found before the eviction (LMDB's tree pages
  // are then in memory: only the values are read from the disk).
  struct Place {
    uint32_t shard;
    uint64_t offset, bytes;
  };
  std::vector<Place> places(reads);
  const Manifest& m = reader.manifest();
  auto txn = reader.BeginRead();
  uint64_t largest = 0;
  for (uint64_t k = 0; k < reads; ++k) {
    const uint8_t* p = nullptr;
    uint64_t n = 0;
    KILN_RETURN_IF_ERROR(txn->Locate(indices[k], &p, &n));
    const int si = m.ShardFor(indices[k]);
    if (reader.mapping(si).base == nullptr)
      return Status::NotSupported(reader.mapping(si).path +
                                  ": kiln cannot tell where its records lie (LMDB pages of "
                                  "another size than the OS's)");
    places[k] = {static_cast<uint32_t>(si), static_cast<uint64_t>(p - reader.mapping(si).base), n};
    largest = std::max(largest, n);
  }
  txn->Reset();
  ShardFiles files;
  KILN_RETURN_IF_ERROR(files.Open(reader));
  KILN_RETURN_IF_ERROR(EvictFromPageCache(reader, &out->resident_before));
  std::atomic<uint64_t> next{0}, bytes{0};
  std::mutex mu;
  Status failed;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      std::vector<uint8_t> buf(largest);
      for (uint64_t k; (k = next.fetch_add(1)) < reads;) {
        const Place& p = places[k];
        Status s = ReadFully(files.fd(p.shard), files.path(p.shard), buf.data(), p.bytes, p.offset);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          failed = s;
          next = reads;
          return;
        }
        bytes += p.bytes;
      }
    });
  for (auto& t : pool) t.join();
  out->seconds = Since(t0);
  KILN_RETURN_IF_ERROR(failed);
  out->bytes = bytes;
  out->reads = reads;
  return Status::OK();
}

}  // namespace kiln
