// SequentialReadAhead (core/page_cache.h), the read-ahead of a pass from a
// file's start to its end (verify, the duplicate scan, the merge's copy):
// what it asks of the disk, what it maps into memory, and that neither
// reaches past the file's end or into another file.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "advisor_scope.h"
#include "core/page_cache.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Range = std::pair<const uint8_t*, const uint8_t*>;

// What every advisor made while a FakeScope lives saw; `resident` says
// which bytes are in memory, `populates` whether the kernel can map them.
struct Seen {
  std::mutex mu;
  std::vector<Range> resident;
  bool populates = true;
  std::vector<Range> will_need, populated;
  int resident_calls = 0, populate_calls = 0;
};

class FakeAdvisor final : public PageAdvisor {
 public:
  explicit FakeAdvisor(Seen* s) : s_(s) {}
  bool Resident(const uint8_t* p, uint64_t n) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->resident_calls;
    for (const Range& r : s_->resident)
      if (p >= r.first && p + n <= r.second) return true;
    return false;
  }
  void WillNeed(const uint8_t* p, uint64_t n) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->will_need.emplace_back(p, p + n);
  }
  bool Populate(const uint8_t* p, uint64_t n) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->populate_calls;
    if (s_->populates) s_->populated.emplace_back(p, p + n);
    return s_->populates;
  }

 private:
  Seen* s_;
};

using FakeScope = AdvisorScope<FakeAdvisor, Seen>;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Whether every range lies in [lo, hi).
bool AllWithin(const std::vector<Range>& ranges, const uint8_t* lo, const uint8_t* hi) {
  for (const Range& r : ranges)
    if (r.first < lo || r.second > hi || r.first >= r.second) return false;
  return true;
}

// Bytes of [lo, hi) covered by the ranges (which may overlap).
uint64_t Covered(std::vector<Range> ranges, const uint8_t* lo, const uint8_t* hi) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t bytes = 0;
  const uint8_t* at = lo;
  for (const Range& r : ranges) {
    const uint8_t* a = std::max(r.first, at);
    const uint8_t* b = std::min(r.second, hi);
    if (b > a) {
      bytes += static_cast<uint64_t>(b - a);
      at = b;
    }
  }
  return bytes;
}

// The first range mapped that starts in [lo, hi), or nullptr.
const Range* FirstMappedIn(const std::vector<Range>& populated, const uint8_t* lo,
                           const uint8_t* hi) {
  for (const Range& r : populated)
    if (r.first >= lo && r.first < hi) return &r;
  return nullptr;
}

// Waits (at most 10 s) until done(*s) holds, asked under s->mu.
template <typename Done>
bool WaitUntil(Seen* s, Done done) {
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (done(*s)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Waits until the worker has mapped something that starts in [lo, hi).
// Nothing is cleared before: the worker may have mapped all it was given
// before the test looks.
bool WaitForPopulate(Seen* s, const uint8_t* lo, const uint8_t* hi) {
  return WaitUntil(s, [&](const Seen& t) { return FirstMappedIn(t.populated, lo, hi) != nullptr; });
}

}  // namespace

TEST_CASE(
    "sequential read-ahead asks the disk for the bytes not in memory and maps those in "
    "memory, never past the file's end",
    "[readahead]") {
  Seen seen;
  FakeScope scope(&seen);
  // A "file" of 21 MiB (never touched: the fake only compares addresses),
  // its first 6 MiB in memory.
  std::vector<uint8_t> file(21 * kMiB);
  const uint8_t* begin = file.data();
  const uint8_t* end = begin + file.size();
  seen.resident.emplace_back(begin, begin + 6 * kMiB);
  {
    SequentialReadAhead ahead(8 * kMiB);
    ahead.Reached(begin, end);
    REQUIRE(WaitForPopulate(&seen, begin, end));  // the first window's first piece is in memory
    for (const uint8_t* p = begin; p < end; p += 64 * 1024) ahead.Reached(p, end);
  }  // the destructor waits for the worker
  // Every byte not in memory was asked of the disk, none in memory was.
  CHECK(AllWithin(seen.will_need, begin + 6 * kMiB, end));
  CHECK(Covered(seen.will_need, begin + 6 * kMiB, end) == 15 * kMiB);
  // What was mapped was in memory; the first piece was.
  CHECK(AllWithin(seen.populated, begin, begin + 6 * kMiB));
  CHECK(seen.populated.front().first == begin);
}

TEST_CASE("sequential read-ahead starts over in another file and keeps to it", "[readahead]") {
  Seen seen;
  FakeScope scope(&seen);
  std::vector<uint8_t> a(5 * kMiB), b(7 * kMiB);
  const uint8_t *a0 = a.data(), *a1 = a0 + a.size(), *b0 = b.data(), *b1 = b0 + b.size();
  seen.resident = {{a0, a1}, {b0, b1}};
  {
    SequentialReadAhead ahead(4 * kMiB);
    for (const uint8_t* p = a0; p < a1; p += 256 * 1024) ahead.Reached(p, a1);
    ahead.Reached(b0, b1);
    REQUIRE(WaitForPopulate(&seen, b0, b1));  // the second file's first piece
    for (const uint8_t* p = b0; p < b1; p += 256 * 1024) ahead.Reached(p, b1);
  }
  CHECK(seen.will_need.empty());  // all in memory: nothing asked of the disk
  // In the second file, mapping started where the pass jumped to.
  const Range* first_in_b = FirstMappedIn(seen.populated, b0, b1);
  REQUIRE(first_in_b != nullptr);
  CHECK(first_in_b->first == b0);
  for (const Range& r : seen.populated) {
    INFO("a mapped range crosses a file's end");
    CHECK(((r.first >= a0 && r.second <= a1) || (r.first >= b0 && r.second <= b1)));
  }
}

TEST_CASE(
    "sequential read-ahead without a known end only advises, and stops mapping where the "
    "kernel cannot",
    "[readahead]") {
  std::vector<uint8_t> file(12 * kMiB);
  const uint8_t* begin = file.data();
  const uint8_t* end = begin + file.size();
  SECTION("no end given: WillNeed only, as far as the window reaches") {
    Seen seen;
    FakeScope scope(&seen);
    seen.resident.emplace_back(begin, end);
    {
      SequentialReadAhead ahead(4 * kMiB);
      for (const uint8_t* p = begin; p < end; p += 128 * 1024) ahead.Reached(p, nullptr);
    }
    CHECK(seen.resident_calls == 0);
    CHECK(seen.populate_calls == 0);
    CHECK(Covered(seen.will_need, begin, end) == 12 * kMiB);
  }
  SECTION("Populate unsupported (a kernel before 5.14): asked once, never again") {
    Seen seen;
    FakeScope scope(&seen);
    seen.resident.emplace_back(begin, end);
    seen.populates = false;
    {
      SequentialReadAhead ahead(4 * kMiB);
      ahead.Reached(begin, end);
      (void)WaitUntil(&seen, [](const Seen& t) { return t.populate_calls > 0; });
      for (const uint8_t* p = begin; p < end; p += 128 * 1024) ahead.Reached(p, end);
    }
    CHECK(seen.populate_calls == 1);
  }
}

TEST_CASE("the kernel's Populate maps a file's pages and stops at its end without a signal",
          "[readahead]") {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  WriteFile(path, std::string(10000, 'k'));  // 3 pages, the last partly past the end
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const size_t map_bytes = 8 * 4096;  // a map larger than the file, as LMDB's may be
  void* m = mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(m != MAP_FAILED);
  const uint8_t* base = static_cast<const uint8_t*>(m);
  std::unique_ptr<PageAdvisor> kernel = MakeKernelPageAdvisor();
  // True where the kernel can (past the end is no error), false only
  // where it has no MADV_POPULATE_READ; never SIGBUS.
  const bool supported = kernel->Populate(base, map_bytes);
  if (supported) CHECK(kernel->Resident(base, 10000));
  CHECK(base[9999] == 'k');
  munmap(m, map_bytes);
}
