// The loader's read-ahead (core/loader.cc, core/page_cache.h) and its fault
// guard (core/fault_guard.h): what is asked of the disk stays within the
// budget, the batches do not change, and a shard changed under a running
// epoch is an error naming it, not a signal.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "advisor_scope.h"
#include "core/fault_guard.h"
#include "core/page_cache.h"
#include "kiln/cache_reader.h"
#include "kiln/duplicates.h"
#include "kiln/loader.h"
#include "kiln/verify.h"
#include "loader_fixture.h"
#include "test_skip.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// What the counting advisor saw, and the bound it checks at every request.
struct Requests {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> released_batches{0};  // counted by the consumer before Release()
  std::atomic<uint64_t> worst_excess{0};      // most bytes ever asked beyond the bound
  uint64_t allowed = 0;                       // bytes that may be asked beyond the released batches
  uint64_t batch_bytes = 0;                   // stored bytes of one full batch
  bool to_kernel = false;  // pass the requests on to madvise, as the real one does
  std::mutex mu;
  std::vector<std::pair<const uint8_t*, uint64_t>> ranges;  // reserved by the test
};

// Says nothing is in memory, so that the read-ahead runs on a warm test
// cache, and records every request.
class CountingAdvisor final : public PageAdvisor {
 public:
  explicit CountingAdvisor(Requests* r) : r_(r) {}
  bool Resident(const uint8_t*, uint64_t) override { return false; }
  void WillNeed(const uint8_t* p, uint64_t n) override {
    const uint64_t total = r_->bytes.fetch_add(n) + n;
    r_->calls.fetch_add(1);
    const uint64_t bound = r_->released_batches.load() * r_->batch_bytes + r_->allowed;
    if (total > bound) {
      uint64_t prev = r_->worst_excess.load();
      while (total - bound > prev && !r_->worst_excess.compare_exchange_weak(prev, total - bound)) {
      }
    }
    {
      std::lock_guard<std::mutex> lock(r_->mu);
      if (r_->ranges.size() < r_->ranges.capacity()) r_->ranges.emplace_back(p, n);
    }
    if (r_->to_kernel) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(p) / 4096 * 4096;
      (void)madvise(reinterpret_cast<void*>(at), reinterpret_cast<uintptr_t>(p) + n - at,
                    MADV_WILLNEED);
    }
  }

 private:
  Requests* r_;
};

// Installs the counting advisor for the loaders made while it lives.
using CountingScope = AdvisorScope<CountingAdvisor, Requests>;

// One epoch's samples in order; `released` (if given) counts each batch
// before its slot goes back, after `pause` (a slow consumer, which lets
// the workers fill the ring and the read-ahead run ahead of them).
std::vector<std::vector<uint8_t>> RunEpoch(Loader* l, Ring* ring, uint64_t epoch,
                                           std::atomic<uint64_t>* released = nullptr,
                                           std::chrono::microseconds pause = {}) {
  std::vector<std::vector<uint8_t>> out;
  REQUIRE(l->StartEpoch(epoch).ok());
  const uint64_t sb = l->sample_bytes();
  for (;;) {
    Batch b;
    Status s = l->Next(&b);
    if (s.IsNotFound()) break;
    INFO(s.ToString());
    REQUIRE(s.ok());
    for (uint64_t j = 0; j < b.size; ++j) {
      const uint8_t* p = ring->data[b.slot].data() + j * sb;
      out.emplace_back(p, p + sb);
    }
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    if (released) released->fetch_add(1);
    l->Release(b.slot);
  }
  return out;
}

// Reads a loader's epoch until a batch fails; returns that Status (OK when
// the whole epoch loaded). After `then` batches, runs `change` once.
template <typename Fn>
Status EpochUntilError(Loader* l, uint64_t then, Fn change) {
  REQUIRE(l->StartEpoch(0).ok());
  for (uint64_t k = 0;; ++k) {
    if (k == then) change();
    Batch b;
    Status s = l->Next(&b);
    if (s.IsNotFound()) return Status::OK();
    if (!s.ok()) return s;
    l->Release(b.slot);
  }
}

}  // namespace

TEST_CASE("read-ahead asks for each upcoming record once, within its byte budget", "[loader]") {
  TempDir dir;
  const uint64_t n = 300, payload = 4096, value = kRecordHeaderSize + payload;
  WriteTestCache(dir.path(), n, DType::kUint8, MakeShape({4096}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  const uint64_t batch = 10;
  const int slots = 3;
  for (uint64_t budget_records : {8ull, 1ull, 40ull}) {
    Requests r;
    r.ranges.reserve(4 * n);
    r.batch_bytes = batch * value;
    r.allowed = budget_records * value + slots * r.batch_bytes;
    CountingScope scope(&r);
    LoaderOptions o;
    o.batch_size = batch;
    o.seed = 4;
    o.readahead_bytes = budget_records * value;
    Ring ring(slots, batch, payload);
    auto l = MakeLoader(reader.get(), o, &ring);
    for (uint64_t epoch : {0, 1}) {
      const uint64_t before = r.calls.load();
      CHECK(RunEpoch(l.get(), &ring, epoch, &r.released_batches, std::chrono::milliseconds(2))
                .size() == n);
      r.released_batches = 0;  // the next epoch's bytes count from its start
      r.bytes = 0;
      // Each request is one record's stored value, asked at most once.
      std::lock_guard<std::mutex> lock(r.mu);
      std::set<const uint8_t*> starts;
      for (size_t k = before; k < r.ranges.size(); ++k) {
        CHECK(r.ranges[k].second == value);
        starts.insert(r.ranges[k].first);
      }
      CHECK(starts.size() == r.ranges.size() - before);
      // Records the workers reached first are not asked for; most are.
      INFO("budget " << budget_records << " records, epoch " << epoch);
      CHECK(starts.size() <= n);
    }
    INFO("budget " << budget_records << " records");
    CHECK(r.worst_excess == 0);
    CHECK(r.calls > 0);
  }

  SECTION("a record larger than the budget is left to the workers") {
    Requests r;
    CountingScope scope(&r);
    LoaderOptions o;
    o.batch_size = batch;
    o.readahead_bytes = value - 1;
    Ring ring(slots, batch, payload);
    auto l = MakeLoader(reader.get(), o, &ring);
    CHECK(RunEpoch(l.get(), &ring, 0).size() == n);
    CHECK(r.calls == 0);
  }
  SECTION("readahead_bytes = 0: no read-ahead") {
    Requests r;
    CountingScope scope(&r);
    LoaderOptions o;
    o.batch_size = batch;
    o.readahead_bytes = 0;
    Ring ring(slots, batch, payload);
    auto l = MakeLoader(reader.get(), o, &ring);
    CHECK(RunEpoch(l.get(), &ring, 0).size() == n);
    CHECK(r.calls == 0);
  }
}

// The kernel's advisor, counting what it is asked to read ahead.
class KernelCounting final : public PageAdvisor {
 public:
  explicit KernelCounting(std::atomic<uint64_t>* asked)
      : kernel_(MakeKernelPageAdvisor()), asked_(asked) {}
  bool Resident(const uint8_t* p, uint64_t n) override { return kernel_->Resident(p, n); }
  void WillNeed(const uint8_t* p, uint64_t n) override {
    asked_->fetch_add(n);
    kernel_->WillNeed(p, n);
  }

 private:
  std::unique_ptr<PageAdvisor> kernel_;
  std::atomic<uint64_t>* asked_;
};

TEST_CASE("eviction without root empties the page cache, and only a cold epoch is read ahead",
          "[loader]") {
  TempDir dir;
  if (OnTmpfs(dir.path())) {
    Skip(SkipWhy::kHostCannot, dir.path() + " is on tmpfs, whose pages cannot be evicted");
    return;
  }
  const uint64_t n = 200, payload = 16384;
  WriteTestCache(dir.path(), n, DType::kUint8, MakeShape({16384}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  std::atomic<uint64_t> asked{0};
  AdvisorScope<KernelCounting, std::atomic<uint64_t>> counting(&asked);
  LoaderOptions o;
  o.batch_size = 16;
  o.readahead_bytes = 1 << 20;
  Ring ring(3, 16, payload);
  auto l = MakeLoader(reader.get(), o, &ring);
  const auto warm = RunEpoch(l.get(), &ring, 0);  // faults the cache in, if it was not
  double resident = 0;
  REQUIRE(ResidentFraction(*reader, &resident).ok());
  CHECK(resident > 0.99);
  asked = 0;
  CHECK(RunEpoch(l.get(), &ring, 1).size() == n);
  CHECK(asked == 0);  // in memory: nothing to read ahead

  // Evicted (mincore says so), the next epoch is read ahead, and equal.
  double after = 1;
  REQUIRE(EvictFromPageCache(*reader, &after).ok());
  INFO("resident after eviction: " << after);
  CHECK(after < 0.05);
  const auto cold = RunEpoch(l.get(), &ring, 0);
  CHECK(asked > 0);
  CHECK(cold == warm);
  REQUIRE(ResidentFraction(*reader, &resident).ok());
  CHECK(resident > 0.9);
}

TEST_CASE("batches with read-ahead equal batches without, byte for byte", "[loader]") {
  TempDir dir;
  WriteTestCache(dir.path(), 130, DType::kFloat16, MakeShape({2, 9, 11}));
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  LoaderOptions o;
  o.batch_size = 6;
  o.seed = 21;
  o.crop = 7;
  o.random_crop = true;
  o.random_flip = true;
  o.rank = 1;
  o.world_size = 3;
  o.workers = 3;
  Ring ring(4, 6, 2 * 7 * 7 * 2);
  o.readahead_bytes = 0;
  std::vector<std::vector<uint8_t>> plain;
  {
    auto l = MakeLoader(reader.get(), o, &ring);
    plain = RunEpoch(l.get(), &ring, 2);
  }
  Requests r;
  r.to_kernel = true;
  CountingScope scope(&r);
  o.readahead_bytes = 3000;  // a few records
  auto l = MakeLoader(reader.get(), o, &ring);
  // A slow consumer: the workers wait for slots, so the read-ahead thread
  // gets its turn even on a loaded machine (without the pause the workers
  // could fill the whole epoch before it was scheduled: 0 calls, seen in a
  // CI run beside a build).
  std::atomic<uint64_t> released{0};
  CHECK(RunEpoch(l.get(), &ring, 2, &released, std::chrono::milliseconds(5)) == plain);
  CHECK(r.calls > 0);
}

TEST_CASE("a shard truncated during an epoch fails a batch naming it, not with a signal",
          "[loader]") {
  for (uint64_t readahead : {uint64_t{0}, uint64_t{1} << 20}) {
    TempDir dir;
    WriteTestCache(dir.path(), 400, DType::kUint8, MakeShape({16384}));
    const std::string shard = dir / "shard-00000.mdb";
    std::unique_ptr<CacheReader> reader;
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
    LoaderOptions o;
    o.batch_size = 20;
    o.shuffle = false;
    o.readahead_bytes = readahead;
    Ring ring(2, 20, 16384);
    auto l = MakeLoader(reader.get(), o, &ring);
    const uint64_t size = reader->mapping(0).file_bytes;
    Status s =
        EpochUntilError(l.get(), 1, [&] { REQUIRE(truncate(shard.c_str(), size / 4) == 0); });
    INFO(s.ToString());
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("shard-00000.mdb") && Catch::Contains("truncated"));
    Batch b;
    CHECK(l->Next(&b).IsCorruption());  // the epoch's stream stays ended
  }
}

TEST_CASE("a shard overwritten during an epoch fails a batch naming it, not with a signal",
          "[loader]") {
  TempDir dir;
  WriteTestCache(dir.path(), 300, DType::kUint8, MakeShape({12000}));
  const std::string shard = dir / "shard-00000.mdb";
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  LoaderOptions o;
  o.batch_size = 10;
  o.seed = 2;
  Ring ring(2, 10, 12000);
  auto l = MakeLoader(reader.get(), o, &ring);
  Status s = EpochUntilError(l.get(), 1, [&] {
    // Every page past LMDB's two meta pages becomes 0xa5 bytes.
    const int fd = ::open(shard.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    const std::vector<uint8_t> junk(1 << 16, 0xa5);
    const off_t size = static_cast<off_t>(reader->mapping(0).file_bytes);
    for (off_t at = 8192; at < size; at += static_cast<off_t>(junk.size()))
      REQUIRE(pwrite(fd, junk.data(), std::min<off_t>(junk.size(), size - at), at) > 0);
    ::close(fd);
  });
  INFO(s.ToString());
  CHECK(!s.ok());
  CHECK_THAT(s.message(), Catch::Contains("shard-00000.mdb"));
}

TEST_CASE("the fault guard turns a fault in its own thread into false, and only there",
          "[loader]") {
  std::string what;
  CHECK(GuardedRead([] {}, &what));
  // A page past the end of a mapped file: SIGBUS.
  TempDir dir;
  const std::string path = dir / "f";
  WriteFile(path, std::string(100, 'x'));
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  void* map = mmap(nullptr, 3 * 4096, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  volatile uint8_t sink = 0;
  CHECK_FALSE(GuardedRead([&] { sink = static_cast<const uint8_t*>(map)[2 * 4096]; }, &what));
  CHECK_THAT(what, Catch::Contains("SIGBUS"));
  // Guarded regions nest, and the thread reads on after a fault.
  CHECK(GuardedRead([&] { sink = static_cast<const uint8_t*>(map)[10]; }, &what));
  bool inner = true;
  CHECK(GuardedRead(
      [&] {
        inner = GuardedRead([&] { sink = static_cast<const uint8_t*>(map)[2 * 4096]; }, nullptr);
      },
      &what));
  CHECK_FALSE(inner);
  munmap(map, 3 * 4096);
}

TEST_CASE("the duplicate scan and kiln verify ask the disk for every record ahead, in file order",
          "[core]") {
  TempDir dir;
  const uint64_t n = 300;
  // Two shards of 4 KB values (LMDB overflow values, as images are).
  WriteTestCache(dir.path(), n, DType::kUint8, MakeShape({4096}), 10, 700 << 10);
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  REQUIRE(reader->manifest().shards.size() == 2);
  // Every record's bytes lie in some range asked for.
  auto uncovered = [&](const Requests& r) {
    std::unique_ptr<ReadTxn> txn = reader->BeginRead();
    uint64_t missed = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint8_t* p = nullptr;
      uint64_t size = 0;
      REQUIRE(txn->Locate(i, &p, &size).ok());
      bool in = false;
      for (const auto& [at, len] : r.ranges) in = in || (p >= at && p + size <= at + len);
      missed += in ? 0 : 1;
    }
    return missed;
  };
  SECTION("FingerprintCache") {
    Requests r;
    r.ranges.reserve(4 * n);
    CountingScope scope(&r);
    std::vector<RecordPrint> prints;
    REQUIRE(FingerprintCache(*reader, 2, &prints).ok());
    CHECK(r.calls.load() > 0);
    CHECK(uncovered(r) == 0);
  }
  SECTION("VerifyCache, full level") {
    Requests r;
    r.ranges.reserve(4 * n);
    CountingScope scope(&r);
    VerifyOptions o;
    o.threads = 2;
    VerifyReport rep;
    REQUIRE(VerifyCache(dir.path(), o, &rep).ok());
    CHECK(rep.problems.empty());
    CHECK(uncovered(r) == 0);
  }
}
