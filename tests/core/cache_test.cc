#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <thread>

#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
void CheckAll(const std::string& dir, uint64_t n, DType dtype, const Shape& shape) {
  std::unique_ptr<CacheReader> r;
  Status s = CacheReader::Open(dir, ReaderOptions(), &r);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(r->size() == n);
  auto txn = r->BeginRead();
  const size_t bytes = shape.NumElements() * DTypeSize(dtype);
  for (uint64_t i = 0; i < n; ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, /*verify_checksum=*/true).ok());
    REQUIRE(v.index == i);
    REQUIRE(v.label == static_cast<int64_t>(i % 10));
    REQUIRE(v.dtype == dtype);
    REQUIRE(v.shape == shape);
    REQUIRE(v.bytes == bytes);
    auto want = TestPayload(i, dtype, bytes);
    REQUIRE(std::memcmp(v.data, want.data(), bytes) == 0);
  }
  RecordView v;
  CHECK(txn->Get(n, &v).IsNotFound());
}
}  // namespace

TEST_CASE("write -> read round trip for every dtype over many shards", "[cache]") {
  for (DType dtype : {DType::kUint8, DType::kFloat16, DType::kFloat32}) {
    TempDir dir;
    const Shape shape = MakeShape({3, 17, 13});
    const uint64_t rec = shape.NumElements() * DTypeSize(dtype);
    // A shard holds 7 records, so 100 records need 15 shards.
    WriteTestCache(dir.path(), 100, dtype, shape, 10, rec * 7);
    CheckAll(dir.path(), 100, dtype, shape);
    std::unique_ptr<CacheReader> r;
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
    CHECK(r->manifest().shards.size() == 15);
    CHECK(r->manifest().shards[14].count == 2);
    CHECK(r->manifest().dtype == dtype);
    VerifyReport rep;
    REQUIRE(VerifyCache(dir.path(), VerifyOptions(), &rep).ok());
    CHECK(rep.clean());
    CHECK(rep.records_checked == 100);
  }
}

TEST_CASE("payload pointers are aligned for the element type", "[cache]") {
  TempDir dir;
  WriteTestCache(dir.path(), 20, DType::kFloat32, MakeShape({3, 64, 64}));
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  auto txn = r->BeginRead();
  for (uint64_t i = 0; i < 20; ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v).ok());
    CHECK(reinterpret_cast<uintptr_t>(v.data) % 16 == 0);
  }
}

TEST_CASE("random access from several threads", "[cache]") {
  TempDir dir;
  const Shape shape = MakeShape({2, 31, 29});
  WriteTestCache(dir.path(), 300, DType::kFloat16, shape, 10, 40000);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  REQUIRE(r->manifest().shards.size() > 5);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto txn = r->BeginRead();
      uint64_t x = 1234567 + t;
      for (int k = 0; k < 2000; ++k) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t i = (x >> 33) % 300;
        RecordView v;
        if (!txn->Get(i, &v, true).ok() || v.label != static_cast<int64_t>(i % 10)) ++bad;
        auto want = TestPayload(i, DType::kFloat16, v.bytes);
        if (std::memcmp(v.data, want.data(), v.bytes) != 0) ++bad;
        if (k % 100 == 0) txn->Reset();
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

TEST_CASE("a writer started with a tiny map still writes 100 MB", "[cache]") {
  TempDir dir;
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = MakeShape({1024, 1024});
  o.initial_map_size = 1 << 20;  // 1 MiB
  o.commit_bytes = 16 << 20;
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
  std::vector<uint8_t> payload(1 << 20);
  for (int i = 0; i < 100; ++i) {
    std::fill(payload.begin(), payload.end(), static_cast<uint8_t>(i));
    Status s = w->Append(i, 0, payload.data());
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  Manifest m;
  REQUIRE(w->Finish(&m).ok());
  CHECK(m.count == 100);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  auto txn = r->BeginRead();
  RecordView v;
  REQUIRE(txn->Get(99, &v, true).ok());
  CHECK(v.data[12345] == 99);
}

TEST_CASE("the same records give byte-identical shards", "[cache]") {
  TempDir a, b;
  WriteTestCache(a.path(), 50, DType::kUint8, MakeShape({3, 32, 32}), 10, 20000);
  WriteTestCache(b.path(), 50, DType::kUint8, MakeShape({3, 32, 32}), 10, 20000);
  for (const auto& e : std::filesystem::directory_iterator(a.path())) {
    const std::string name = e.path().filename().string();
    if (name == ".kiln.lock") continue;
    INFO(name);
    CHECK(ReadFile(a / name) == ReadFile(b / name));
  }
}

TEST_CASE("a second writer on the same directory is refused", "[cache]") {
  TempDir dir;
  WriterOptions o;
  o.shape = MakeShape({4});
  std::unique_ptr<CacheWriter> w1, w2;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w1).ok());
  Status s = CacheWriter::Open(o, dir.path(), &w2);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("in use"));
}

TEST_CASE("resume continues after the committed records", "[cache]") {
  TempDir dir, ref;
  const Shape shape = MakeShape({8, 8});
  WriteTestCache(ref.path(), 40, DType::kUint8, shape, 10, 64 * 9);
  {
    WriterOptions o;
    o.dtype = DType::kUint8;
    o.shape = shape;
    o.shard_size = 64 * 9;
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
    for (uint64_t i = 0; i < 23; ++i) {
      auto p = TestPayload(i, DType::kUint8, 64);
      REQUIRE(w->Append(i, i % 10, p.data()).ok());
    }
    REQUIRE(w->Commit().ok());
    // Dropped without Finish: no manifest, the cache is incomplete.
  }
  std::unique_ptr<CacheReader> r;
  Status s = CacheReader::Open(dir.path(), ReaderOptions(), &r);
  CHECK(s.IsIncomplete());
  CHECK_THAT(s.message(), Catch::Contains("incomplete"));
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = shape;
  o.shard_size = 64 * 9;
  o.resume = true;
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
  REQUIRE(w->next_index() == 23);
  for (uint64_t i = 23; i < 40; ++i) {
    auto p = TestPayload(i, DType::kUint8, 64);
    REQUIRE(w->Append(i, i % 10, p.data()).ok());
  }
  Manifest m;
  for (int c = 0; c < 10; ++c) m.classes.push_back("class" + std::to_string(c));
  REQUIRE(w->Finish(&m).ok());
  CheckAll(dir.path(), 40, DType::kUint8, shape);
  CHECK(ReadFile(dir / "manifest.json") == ReadFile(ref / "manifest.json"));
}

TEST_CASE("verify full finds NaN and Inf in float payloads", "[cache]") {
  for (DType dtype : {DType::kFloat16, DType::kFloat32}) {
    TempDir dir;
    WriterOptions o;
    o.dtype = dtype;
    o.shape = MakeShape({600});
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
    for (uint64_t i = 0; i < 4; ++i) {
      std::vector<uint8_t> p(600 * DTypeSize(dtype), 0);
      const bool half = dtype == DType::kFloat16;
      if (i == 1) {  // every element the largest finite value, either sign: clean
        for (size_t e = 0; e < 600; ++e) {
          if (half) {
            p[e * 2] = 0xFF;
            p[e * 2 + 1] = e % 2 ? 0xFB : 0x7B;
          } else {
            p[e * 4] = p[e * 4 + 1] = 0xFF;
            p[e * 4 + 2] = 0x7F;
            p[e * 4 + 3] = e % 2 ? 0xFF : 0x7F;
          }
        }
      }
      if (i == 2) {  // element 513 is +Inf / NaN
        if (half) {
          p[513 * 2 + 1] = 0x7C;
        } else {
          p[513 * 4 + 3] = 0x7F;
          p[513 * 4 + 2] = 0xC0;
        }
      }
      if (i == 3) {  // the last element is -Inf
        if (half) {
          p[599 * 2 + 1] = 0xFC;
        } else {
          p[599 * 4 + 3] = 0xFF;
          p[599 * 4 + 2] = 0x80;
        }
      }
      REQUIRE(w->Append(i, 0, p.data()).ok());
    }
    Manifest m;
    REQUIRE(w->Finish(&m).ok());
    VerifyReport r;
    REQUIRE(VerifyCache(dir.path(), VerifyOptions(), &r).ok());
    REQUIRE(r.problems.size() == 2);
    CHECK(r.problems[0].index == 2);
    CHECK(r.problems[1].index == 3);
    CHECK_THAT(r.problems[0].what, Catch::Contains("NaN or Inf"));
    CHECK_THAT(r.problems[1].what, Catch::Contains("NaN or Inf"));
  }
}

TEST_CASE("a writer dropped mid-shard resumes to the bytes of an uninterrupted one", "[cache]") {
  // 5 records per commit, 40 per shard: the crash point is after several
  // commits inside a shard; no explicit Commit, so no rewrite at the end.
  const Shape shape = MakeShape({3, 32, 32});
  auto options = [&](bool resume) {
    WriterOptions o;
    o.dtype = DType::kFloat16;
    o.shape = shape;
    o.commit_bytes = 5 * (kRecordHeaderSize + 6144) - 100;
    o.shard_size = 40 * 6144;
    o.resume = resume;
    return o;
  };
  auto write = [&](const std::string& dir, uint64_t begin, uint64_t end, bool resume, bool finish) {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(options(resume), dir, &w).ok());
    REQUIRE(w->next_index() == begin);
    for (uint64_t i = begin; i < end; ++i) {
      auto p = TestPayload(i, DType::kFloat16, 6144);
      REQUIRE(w->Append(i, static_cast<int64_t>(i % 10), p.data()).ok());
    }
    if (finish) {
      Manifest m;
      REQUIRE(w->Finish(&m).ok());
    }
  };
  TempDir ref, dir;
  write(ref.path(), 0, 100, false, true);
  for (uint64_t crash : {3u, 57u, 63u}) {
    std::filesystem::remove_all(dir.path());
    write(dir.path(), 0, crash, false, false);  // dropped: its last partial batch is lost
    const uint64_t committed = crash / 40 * 40 + (crash % 40) / 5 * 5;
    write(dir.path(), committed, 100, true, true);
    for (const char* shard : {"shard-00000.mdb", "shard-00001.mdb", "shard-00002.mdb"}) {
      INFO("crash after " << crash << ", " << shard);
      CHECK(ReadFile(dir / shard) == ReadFile(ref / shard));
    }
    CHECK(ReadFile(dir / "manifest.json") == ReadFile(ref / "manifest.json"));
  }
}

TEST_CASE("two readers of one cache in a process: closing one leaves the other reading",
          "[cache]") {
  // LMDB clears all of a process's reader slots in a file's lock table when
  // any environment on that file closes; the readers share one environment
  // per shard so that closing a reader (or a verify) cannot break another.
  TempDir dir;
  WriteTestCache(dir.path(), 50, DType::kFloat16, MakeShape({3, 4, 4}), 10, 4096);
  std::unique_ptr<CacheReader> a;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &a).ok());
  REQUIRE(a->manifest().shards.size() > 1);
  auto txn = a->BeginRead();
  RecordView v;
  REQUIRE(txn->Get(3, &v, true).ok());
  txn->Reset();  // a loader's worker between batches: its slots are reserved
  for (int round = 0; round < 2; ++round) {
    std::unique_ptr<CacheReader> b;
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &b).ok());
    auto other = b->BeginRead();
    REQUIRE(other->Get(40, &v, true).ok());
    other.reset();
    b.reset();
    VerifyOptions vo;
    vo.level = VerifyLevel::kFull;
    VerifyReport report;
    REQUIRE(VerifyCache(dir.path(), vo, &report).ok());
    CHECK(report.clean());
  }
  for (uint64_t i : {3ull, 25ull, 49ull}) {
    Status s = txn->Get(i, &v, true);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(v.label == static_cast<int64_t>(i % 10));
  }
}
