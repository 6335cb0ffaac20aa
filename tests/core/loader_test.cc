#include "kiln/loader.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <utility>

#include "kiln/cache_reader.h"
#include "loader_fixture.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

// Counts heap allocations while `g_count_allocs` is set (all threads).
//
// Every form of operator new and delete that is not over-aligned is
// replaced, all over malloc and free: a sanitizer's runtime brings its own
// definitions of the forms a program leaves alone, so replacing only
// new(size_t) and delete(void*) paired AddressSanitizer's nothrow new
// (Catch2 makes its test invokers with it) with this file's free
// (alloc-dealloc-mismatch when Catch2's registry was destroyed at exit).
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};
static void* CountedAlloc(size_t n) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  return std::malloc(n ? n : 1);
}
void* operator new(size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return CountedAlloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return CountedAlloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

struct Fixture {
  TempDir dir;
  std::unique_ptr<CacheReader> reader;
  Fixture(uint64_t n, const Shape& shape, DType dtype = DType::kUint8) {
    WriteTestCache(dir.path(), n, dtype, shape, 10, 5000);
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  }
};

// Runs one epoch; returns the sample bytes and labels in batch order.
struct Epoch {
  std::vector<uint64_t> sizes;
  std::vector<std::vector<uint8_t>> samples;
  std::vector<int64_t> labels;
};

Epoch RunEpoch(Loader* loader, Ring* ring, uint64_t epoch, uint64_t start = 0, uint64_t skip = 0) {
  Epoch e;
  REQUIRE(loader->StartEpoch(epoch, start, skip).ok());
  const uint64_t sb = loader->sample_bytes();
  for (;;) {
    Batch b;
    Status s = loader->Next(&b);
    if (s.IsNotFound()) break;
    REQUIRE(s.ok());
    e.sizes.push_back(b.size);
    for (uint64_t j = 0; j < b.size; ++j) {
      const uint8_t* p = ring->data[b.slot].data() + j * sb;
      e.samples.emplace_back(p, p + sb);
      e.labels.push_back(ring->labels[b.slot][j]);
    }
    loader->Release(b.slot);
  }
  return e;
}

// The K x K window at (y0, x0) of record `idx`, a uint8 CxHxW record,
// mirrored left to right if `flip`.
std::vector<uint8_t> Window(ReadTxn* txn, uint64_t idx, uint32_t k, uint32_t y0, uint32_t x0,
                            bool flip) {
  RecordView v;
  REQUIRE(txn->Get(idx, &v).ok());
  const uint32_t c = v.shape.dims[0], h = v.shape.dims[1], w = v.shape.dims[2];
  std::vector<uint8_t> out;
  for (uint32_t ch = 0; ch < c; ++ch)
    for (uint32_t y = 0; y < k; ++y)
      for (uint32_t x = 0; x < k; ++x)
        out.push_back(v.data[(ch * h + y0 + y) * w + x0 + (flip ? k - 1 - x : x)]);
  return out;
}

}  // namespace

TEST_CASE("every sample exactly once per epoch, bit-identical to the records", "[loader]") {
  const Shape shape = MakeShape({3, 5, 7});
  Fixture f(103, shape);
  for (bool drop_last : {false, true}) {
    LoaderOptions o;
    o.batch_size = 10;
    o.drop_last = drop_last;
    o.seed = 3;
    Ring ring(3, 10, 105);
    auto l = MakeLoader(f.reader.get(), o, &ring);
    CHECK(l->batches_per_epoch() == (drop_last ? 10u : 11u));
    Epoch e = RunEpoch(l.get(), &ring, 0);
    REQUIRE(e.sizes.size() == l->batches_per_epoch());
    if (!drop_last) CHECK(e.sizes.back() == 3);
    std::vector<uint64_t> order = l->EpochOrder(0);
    REQUIRE(order.size() == 103);
    CHECK(std::set<uint64_t>(order.begin(), order.end()).size() == 103);
    auto txn = f.reader->BeginRead();
    for (size_t k = 0; k < e.samples.size(); ++k) {
      RecordView v;
      REQUIRE(txn->Get(order[k], &v).ok());
      REQUIRE(std::memcmp(e.samples[k].data(), v.data, v.bytes) == 0);
      REQUIRE(e.labels[k] == v.label);
    }
    CHECK(e.samples.size() == (drop_last ? 100u : 103u));
  }
}

TEST_CASE("a fresh permutation each epoch, the same for the same seed", "[loader]") {
  Fixture f(200, MakeShape({4}));
  LoaderOptions o;
  o.seed = 11;
  Ring ring(2, 256, 4);
  auto a = MakeLoader(f.reader.get(), o, &ring);
  o.workers = 1;
  auto b = MakeLoader(f.reader.get(), o, &ring);
  CHECK(a->EpochOrder(0) == b->EpochOrder(0));
  CHECK(a->EpochOrder(0) != a->EpochOrder(1));
  o.seed = 12;
  auto c = MakeLoader(f.reader.get(), o, &ring);
  CHECK(a->EpochOrder(0) != c->EpochOrder(0));
  o.shuffle = false;
  auto seq = MakeLoader(f.reader.get(), o, &ring);
  auto s = seq->EpochOrder(5);
  for (uint64_t i = 0; i < 200; ++i) REQUIRE(s[i] == i);
}

TEST_CASE("rank partitions are disjoint, covering and equal in batch count", "[loader]") {
  for (uint64_t n : {120ull, 123ull}) {
    Fixture f(n, MakeShape({2}));
    const int w = 4;
    std::multiset<uint64_t> all;
    std::set<uint64_t> batches;
    for (int r = 0; r < w; ++r) {
      LoaderOptions o;
      o.batch_size = 8;
      o.rank = r;
      o.world_size = w;
      o.seed = 5;
      Ring ring(2, 8, 2);
      auto l = MakeLoader(f.reader.get(), o, &ring);
      auto order = l->EpochOrder(2);
      all.insert(order.begin(), order.end());
      batches.insert(l->batches_per_epoch());
    }
    CHECK(batches.size() == 1);
    // Covering; disjoint when W divides n, else padded by wrap-around.
    CHECK(std::set<uint64_t>(all.begin(), all.end()).size() == n);
    CHECK(all.size() == (n + w - 1) / w * w);
  }
}

TEST_CASE("resume mid-epoch yields exactly the remaining batches", "[loader]") {
  Fixture f(90, MakeShape({3, 4, 4}));
  LoaderOptions o;
  o.batch_size = 7;
  o.seed = 9;
  Ring ring(4, 7, 48);
  auto l = MakeLoader(f.reader.get(), o, &ring);
  Epoch full = RunEpoch(l.get(), &ring, 3);
  Epoch tail = RunEpoch(l.get(), &ring, 3, 5);
  REQUIRE(tail.samples.size() == full.samples.size() - 35);
  for (size_t k = 0; k < tail.samples.size(); ++k) REQUIRE(tail.samples[k] == full.samples[k + 35]);
  CHECK(l->position().batch == l->batches_per_epoch());
}

TEST_CASE("crop and flip produce the right pixels", "[loader]") {
  const uint32_t C = 2, H = 9, W = 12, K = 5;
  Fixture f(40, MakeShape({C, H, W}));
  auto txn = f.reader->BeginRead();
  auto window = [&](uint64_t idx, uint32_t y0, uint32_t x0, bool flip) {
    return Window(txn.get(), idx, K, y0, x0, flip);
  };
  SECTION("center crop, as torchvision rounds it") {
    LoaderOptions o;
    o.shuffle = false;
    o.crop = K;
    Ring ring(2, 256, C * K * K);
    auto l = MakeLoader(f.reader.get(), o, &ring);
    Epoch e = RunEpoch(l.get(), &ring, 0);
    // round((9-5)/2) = 2, round((12-5)/2) = round(3.5) = 4
    for (uint64_t i = 0; i < 40; ++i) REQUIRE(e.samples[i] == window(i, 2, 4, false));
  }
  SECTION("random crop and flip: a valid window, seeded, both flips seen") {
    LoaderOptions o;
    o.shuffle = false;
    o.crop = K;
    o.random_crop = true;
    o.random_flip = true;
    o.seed = 77;
    Ring ring(2, 256, C * K * K);
    auto l = MakeLoader(f.reader.get(), o, &ring);
    Epoch e = RunEpoch(l.get(), &ring, 0);
    Epoch again = RunEpoch(l.get(), &ring, 0);
    Epoch next = RunEpoch(l.get(), &ring, 1);
    CHECK(e.samples == again.samples);
    CHECK(e.samples != next.samples);
    int flips = 0;
    std::set<std::pair<uint32_t, uint32_t>> offsets;
    for (uint64_t i = 0; i < 40; ++i) {
      bool found = false;
      for (uint32_t y0 = 0; y0 <= H - K && !found; ++y0)
        for (uint32_t x0 = 0; x0 <= W - K && !found; ++x0)
          for (bool fl : {false, true})
            if (!found && e.samples[i] == window(i, y0, x0, fl)) {
              found = true;
              flips += fl;
              offsets.insert({y0, x0});
            }
      REQUIRE(found);
    }
    CHECK(flips > 5);
    CHECK(flips < 35);
    CHECK(offsets.size() > 5);
  }
}

TEST_CASE("the center crop starts where torchvision's CenterCrop does, for odd and even margins",
          "[loader]") {
  // CenterCrop: int(round(margin / 2)) in Python, half to even: 0.5 -> 0,
  // 1.5 -> 2, 2.5 -> 2, 3.5 -> 4. A floor (1.5 -> 1, 3.5 -> 3) or rounding
  // half up (0.5 -> 1, 2.5 -> 3) differs. tests/python/test_center_crop.py
  // compares kiln.Loader with torchvision itself.
  const uint32_t kTorchvision[] = {0, 0, 1, 2, 2, 2, 3, 4};  // the offset for margins 0..7
  const uint32_t C = 2, K = 4;
  const std::pair<uint32_t, uint32_t> margins[] = {{7, 4}, {5, 1}, {3, 6}, {0, 2}};
  for (const auto& [mh, mw] : margins) {
    Fixture f(12, MakeShape({C, K + mh, K + mw}));
    LoaderOptions o;
    o.shuffle = false;
    o.crop = K;
    Ring ring(2, 256, C * K * K);
    auto l = MakeLoader(f.reader.get(), o, &ring);
    const Epoch e = RunEpoch(l.get(), &ring, 0);
    auto txn = f.reader->BeginRead();
    INFO("margins " << mh << " (rows) and " << mw << " (columns)");
    REQUIRE(e.samples.size() == 12);
    for (uint64_t i = 0; i < 12; ++i)
      CHECK(e.samples[i] == Window(txn.get(), i, K, kTorchvision[mh], kTorchvision[mw], false));
  }
}

TEST_CASE("slots are reused with no allocation after warm-up", "[loader]") {
  Fixture f(400, MakeShape({3, 8, 8}), DType::kFloat16);
  LoaderOptions o;
  o.batch_size = 16;
  Ring ring(3, 16, 384);
  auto l = MakeLoader(f.reader.get(), o, &ring);
  REQUIRE(l->StartEpoch(0).ok());
  std::vector<int> seen;
  seen.reserve(25);
  bool all_ok = true;  // no Catch macro inside: they allocate
  for (int k = 0; k < 25; ++k) {
    if (k == 5) {
      g_allocs = 0;
      g_count_allocs = true;
    }
    Batch b;
    all_ok = l->Next(&b).ok() && all_ok;
    seen.push_back(b.slot);
    l->Release(b.slot);
  }
  g_count_allocs = false;
  CHECK(all_ok);
  CHECK(g_allocs == 0);
  for (size_t k = 0; k < seen.size(); ++k) CHECK(seen[k] == static_cast<int>(k % 3));
}

TEST_CASE("a damaged record fails the batch naming it, and the loader goes on after", "[loader]") {
  TempDir dir;
  WriteTestCache(dir.path(), 60, DType::kUint8, MakeShape({64}));
  const std::string shard = dir / "shard-00000.mdb";
  FlipByte(shard, PayloadOffset(ReadFile(shard), 25, DType::kUint8, 64) + 10);
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  LoaderOptions o;
  o.verify_checksums = true;
  o.shuffle = false;
  o.batch_size = 10;
  o.workers = 2;
  Ring ring(2, 10, 64);
  auto l = MakeLoader(reader.get(), o, &ring);
  REQUIRE(l->StartEpoch(0).ok());
  Batch b;
  for (int i = 0; i < 2; ++i) {
    REQUIRE(l->Next(&b).ok());
    l->Release(b.slot);
  }
  // Batch 2 holds record 25: its error names shard and record.
  Status s = l->Next(&b);
  INFO(s.ToString());
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("shard-00000.mdb") && Catch::Contains("record 25"));
  CHECK(l->position().batch == 2);  // a resume loads the failed batch again
  CHECK(l->Next(&b).IsCorruption());  // the epoch's stream stays ended
  // The failed batch's slot is not held: the loader starts again, past it.
  REQUIRE(l->StartEpoch(0, 3).ok());
  Epoch rest = RunEpoch(l.get(), &ring, 0, 3);
  CHECK(rest.samples.size() == 30);
  CHECK(rest.labels.front() == 30 % 10);
  // The next epoch (the same sequential order) fails at the same batch.
  REQUIRE(l->StartEpoch(1).ok());
  int ok = 0;
  while ((s = l->Next(&b)).ok()) {
    ++ok;
    l->Release(b.slot);
  }
  CHECK(s.IsCorruption());
  CHECK(ok == 2);
  // Without checksums the payload damage goes unseen: the epoch completes.
  o.verify_checksums = false;
  l = MakeLoader(reader.get(), o, &ring);
  CHECK(RunEpoch(l.get(), &ring, 0).samples.size() == 60);
}

TEST_CASE("asking for more batches than slots without releasing is an error, not a hang",
          "[loader]") {
  Fixture f(60, MakeShape({8}));
  LoaderOptions o;
  o.batch_size = 10;
  Ring ring(2, 10, 8);
  auto l = MakeLoader(f.reader.get(), o, &ring);
  REQUIRE(l->StartEpoch(0).ok());
  Batch a, b, c;
  REQUIRE(l->Next(&a).ok());
  REQUIRE(l->Next(&b).ok());
  Status s = l->Next(&c);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains("still holds"));
  l->Release(a.slot);
  CHECK(l->Next(&c).ok());  // now slot 0 is free for batch 2
  l->Release(b.slot);
  l->Release(c.slot);
  // Options that cannot work are refused up front.
  LoaderOptions bad = o;
  bad.crop = 4;
  CHECK(Loader::Open(f.reader.get(), bad, ring.slots, &l).IsInvalidArgument());
  bad = o;
  bad.rank = 3;
  CHECK(Loader::Open(f.reader.get(), bad, ring.slots, &l).IsInvalidArgument());
}

TEST_CASE("the loaded bytes do not depend on the worker count, with crop, flip and a rank",
          "[loader]") {
  Fixture f(70, MakeShape({2, 9, 11}));
  LoaderOptions o;
  o.batch_size = 6;
  o.seed = 21;
  o.crop = 7;
  o.random_crop = true;
  o.random_flip = true;
  o.rank = 1;
  o.world_size = 3;
  Ring ring(4, 6, 2 * 7 * 7);
  std::vector<Epoch> runs;
  for (int workers : {1, 3, 5}) {
    o.workers = workers;
    auto l = MakeLoader(f.reader.get(), o, &ring);
    // A restart mid-stream first: what was in flight must not leak into the epoch.
    REQUIRE(l->StartEpoch(4).ok());
    Batch b;
    REQUIRE(l->Next(&b).ok());
    l->Release(b.slot);
    runs.push_back(RunEpoch(l.get(), &ring, 2));
  }
  REQUIRE(runs[0].samples.size() == 24);  // ceil(70 / 3) = 24 samples on each rank
  for (size_t k = 1; k < runs.size(); ++k) {
    CHECK(runs[k].samples == runs[0].samples);
    CHECK(runs[k].labels == runs[0].labels);
  }
}

TEST_CASE("boxes report each sample's window and flip, and the output shows that window",
          "[loader]") {
  const uint32_t C = 2, H = 9, W = 12, K = 5;
  Fixture f(40, MakeShape({C, H, W}));
  auto txn = f.reader->BeginRead();
  LoaderOptions o;
  o.shuffle = false;
  o.crop = K;
  o.random_crop = true;
  o.random_flip = true;
  o.seed = 3;
  o.batch_size = 16;
  Ring ring(2, 16, C * K * K);
  std::vector<std::vector<int64_t>> boxes(2, std::vector<int64_t>(16 * 5, -1));
  for (int s = 0; s < 2; ++s) ring.slots[s].boxes = boxes[s].data();
  auto l = MakeLoader(f.reader.get(), o, &ring);
  REQUIRE(l->StartEpoch(0).ok());
  uint64_t seen = 0;
  for (;;) {
    Batch b;
    Status s = l->Next(&b);
    if (s.IsNotFound()) break;
    REQUIRE(s.ok());
    for (uint64_t j = 0; j < b.size; ++j, ++seen) {
      const int64_t* box = &boxes[b.slot][j * 5];
      CHECK(box[2] == K);
      CHECK(box[3] == K);
      const uint8_t* p = ring.data[b.slot].data() + j * C * K * K;
      const std::vector<uint8_t> got(p, p + C * K * K);
      CHECK(got == Window(txn.get(), seen, K, static_cast<uint32_t>(box[0]),
                          static_cast<uint32_t>(box[1]), box[4] == 1));
    }
    l->Release(b.slot);
  }
  CHECK(seen == 40);
}

TEST_CASE("RandomResizedCrop: boxes inside the record, seeded, and no allocation after warm-up",
          "[loader]") {
  Fixture f(400, MakeShape({3, 20, 30}));
  LoaderOptions o;
  o.batch_size = 16;
  o.crop = 12;
  o.crop_kind = CropKind::kRandomResized;
  o.random_flip = true;
  o.output_dtype = DType::kFloat16;
  o.readahead_bytes = 0;
  o.max_crop = 16;
  // Float output needs the manifest's mean and std: the test cache is not
  // normalized; without them Open says so, naming the manifest.
  {
    Ring ring(3, 16, 3 * 16 * 16 * 2);
    std::unique_ptr<Loader> l;
    Status s = Loader::Open(f.reader.get(), o, ring.slots, &l);
    if (!s.ok()) {
      CHECK(s.ToString().find("mean") != std::string::npos);
      o.output_dtype = DType::kUint8;
    }
  }
  uint64_t slot_bytes = 0;
  REQUIRE(LoaderSlotBytes(f.reader->manifest(), o, &slot_bytes).ok());
  CHECK(slot_bytes == 16 * 3 * 16 * 16 * DTypeSize(*o.output_dtype));
  Ring ring(3, 16, 3 * 16 * 16 * 2);
  std::vector<std::vector<int64_t>> boxes(3, std::vector<int64_t>(16 * 5, -1));
  for (int s = 0; s < 3; ++s) ring.slots[s].boxes = boxes[s].data();
  auto l = MakeLoader(f.reader.get(), o, &ring);
  CHECK(l->sample_shape() == MakeShape({3, 12, 12}));
  REQUIRE(l->StartEpoch(0).ok());
  bool all_ok = true, inside = true;
  std::set<std::vector<int64_t>> distinct;
  for (int k = 0; k < 25; ++k) {
    if (k == 5) {
      g_allocs = 0;
      g_count_allocs = true;
    }
    Batch b;
    all_ok = l->Next(&b).ok() && all_ok;
    for (uint64_t j = 0; j < b.size; ++j) {
      const int64_t* x = &boxes[b.slot][j * 5];
      inside = inside && x[0] >= 0 && x[1] >= 0 && x[2] >= 1 && x[3] >= 1 && x[0] + x[2] <= 20 &&
               x[1] + x[3] <= 30 && (x[4] == 0 || x[4] == 1);
    }
    g_count_allocs = false;
    if (k < 3) distinct.insert(std::vector<int64_t>(&boxes[b.slot][0], &boxes[b.slot][5]));
    g_count_allocs = k >= 5;
    l->Release(b.slot);
  }
  g_count_allocs = false;
  CHECK(all_ok);
  CHECK(inside);
  CHECK(g_allocs == 0);
  CHECK(distinct.size() == 3);
}

TEST_CASE("SetResolution changes the output size between epochs, up to max_crop", "[loader]") {
  const uint32_t C = 2, H = 9, W = 12;
  Fixture f(20, MakeShape({C, H, W}));
  auto txn = f.reader->BeginRead();
  LoaderOptions o;
  o.shuffle = false;
  o.crop = 5;
  o.max_crop = 8;
  Ring ring(2, 256, C * 8 * 8);
  auto l = MakeLoader(f.reader.get(), o, &ring);
  Epoch e = RunEpoch(l.get(), &ring, 0);
  CHECK(e.samples[3] == Window(txn.get(), 3, 5, 2, 4, false));
  REQUIRE(l->SetResolution(8).ok());
  CHECK(l->sample_shape() == MakeShape({C, 8, 8}));
  CHECK(l->sample_bytes() == C * 8 * 8);
  e = RunEpoch(l.get(), &ring, 1);
  // round((9-8)/2) = round(0.5) = 0, round((12-8)/2) = 2
  CHECK(e.samples[3] == Window(txn.get(), 3, 8, 0, 2, false));
  Status s = l->SetResolution(9);
  CHECK(s.IsInvalidArgument());
  CHECK(s.ToString().find("max_crop") != std::string::npos);
  CHECK(l->sample_shape() == MakeShape({C, 8, 8}));
}

TEST_CASE("an epoch started after `skip` samples covers the rest once, over any world size",
          "[loader]") {
  Fixture f(103, MakeShape({2, 4, 4}));
  auto txn = f.reader->BeginRead();
  // Two ranks of batch 4 took 5 batches each: the job consumed the first 40
  // samples of epoch 1's permutation.
  // Rank r of `world`, batch `batch`, seed 3, shuffled.
  auto rank_options = [](uint64_t batch, int r, int world) {
    LoaderOptions o;
    o.batch_size = batch;
    o.seed = 3;
    o.rank = r;
    o.world_size = world;
    o.shuffle = true;
    return o;
  };
  std::vector<uint64_t> consumed;
  uint64_t skip = 0;
  for (int r = 0; r < 2; ++r) {
    Ring ring(2, 4, 32);
    auto l = MakeLoader(f.reader.get(), rank_options(4, r, 2), &ring);
    const std::vector<uint64_t> order = l->EpochOrder(1);
    consumed.insert(consumed.end(), order.begin(), order.begin() + 20);
    skip = l->Consumed(0, 5);
  }
  CHECK(skip == 40);
  // Three ranks of batch 5 go on from there: 63 samples, 21 each.
  std::vector<uint64_t> rest;
  for (int r = 0; r < 3; ++r) {
    Ring ring(2, 5, 32);
    auto l = MakeLoader(f.reader.get(), rank_options(5, r, 3), &ring);
    const std::vector<uint64_t> order = l->EpochOrder(1, skip);
    CHECK(order.size() == 21);
    Epoch e = RunEpoch(l.get(), &ring, 1, 0, skip);
    REQUIRE(e.samples.size() == order.size());
    for (size_t k = 0; k < order.size(); ++k) {
      RecordView v;
      REQUIRE(txn->Get(order[k], &v).ok());
      CHECK(e.samples[k] == std::vector<uint8_t>(v.data, v.data + v.bytes));
    }
    CHECK(l->position().consumed == 103);
    rest.insert(rest.end(), order.begin(), order.end());
  }
  std::vector<uint64_t> all = consumed;
  all.insert(all.end(), rest.begin(), rest.end());
  std::sort(all.begin(), all.end());
  for (uint64_t i = 0; i < 103; ++i) REQUIRE(all[i] == i);
}
