// Appending to a finished cache (WriterOptions::append): new records in new
// shards after the old ones, the old manifest in place until the new one is
// published, interrupted appends resumed to the bytes of uninterrupted ones.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

const Shape kShape = MakeShape({4, 8, 8});
constexpr size_t kBytes = 4 * 8 * 8;

WriterOptions Options(bool append) {
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = kShape;
  o.shard_size = kBytes * 9;                             // 9 records a shard
  o.commit_bytes = 4 * (kRecordHeaderSize + kBytes) - 1;  // a commit every 4 records
  o.initial_map_size = 1 << 20;
  o.append = append;
  o.append_from = "test batch";
  return o;
}

std::vector<std::string> Classes() {
  std::vector<std::string> c;
  for (int i = 0; i < 10; ++i) c.push_back("class" + std::to_string(i));
  return c;
}

// Writes records [begin, end) (a new cache, or an append) and finishes.
void Write(const std::string& dir, uint64_t begin, uint64_t end, bool append) {
  std::unique_ptr<CacheWriter> w;
  const Status s = CacheWriter::Open(Options(append), dir, &w);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(w->next_index() == begin);
  for (uint64_t i = begin; i < end; ++i) {
    auto p = TestPayload(i, DType::kUint8, kBytes);
    REQUIRE(w->Append(i, static_cast<int64_t>(i % 10), p.data()).ok());
  }
  Manifest m;
  m.classes = Classes();
  REQUIRE(w->Finish(&m).ok());
}

// Every record 0..n-1 reads back with its checksum, payload and label.
void CheckRecords(const std::string& dir, uint64_t n) {
  std::unique_ptr<CacheReader> r;
  const Status s = CacheReader::Open(dir, ReaderOptions(), &r);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(r->size() == n);
  auto txn = r->BeginRead();
  for (uint64_t i = 0; i < n; ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, /*verify_checksum=*/true).ok());
    CHECK(v.label == static_cast<int64_t>(i % 10));
    auto want = TestPayload(i, DType::kUint8, kBytes);
    REQUIRE(std::memcmp(v.data, want.data(), kBytes) == 0);
  }
  VerifyReport rep;
  REQUIRE(VerifyCache(dir, VerifyOptions(), &rep).ok());
  for (const VerifyProblem& p : rep.problems) UNSCOPED_INFO(p.what);
  CHECK(rep.clean());
  CHECK(rep.records_checked == n);
}

std::vector<std::string> ShardFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (int i = 0; std::filesystem::exists(dir + "/" + ShardFileName(i)); ++i)
    out.push_back(ShardFileName(i));
  return out;
}

}  // namespace

TEST_CASE("an append adds records in new shards and leaves the old shards' bytes alone",
          "[cache][append]") {
  TempDir dir;
  Write(dir.path(), 0, 30, false);  // shards 0..3 (9, 9, 9, 3)
  std::vector<std::string> before;
  for (const std::string& f : ShardFiles(dir.path())) before.push_back(ReadFile(dir / f));
  REQUIRE(before.size() == 4);
  Write(dir.path(), 30, 40, true);
  Write(dir.path(), 40, 47, true);
  CheckRecords(dir.path(), 47);
  for (size_t k = 0; k < before.size(); ++k) CHECK(ReadFile(dir / ShardFileName(k)) == before[k]);
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  CHECK(m.shards.size() == 4 + 2 + 1);  // 10 new records: 9 + 1; then 7
  CHECK(m.shards[4].first == 30);
  CHECK(m.classes == Classes());
  REQUIRE(m.appends.size() == 2);
  CHECK(m.appends[0].count_before == 30);
  CHECK(m.appends[0].count_after == 40);
  CHECK(m.appends[1].count_before == 40);
  CHECK(m.appends[1].count_after == 47);
  CHECK(m.appends[1].from == "test batch");
  CHECK(m.appends[1].time.size() == 20);  // 2026-12-07T01:02:03Z
  // The history survives a round trip through the JSON.
  Manifest back;
  REQUIRE(ManifestFromJson(ManifestToJson(m), "test", &back).ok());
  REQUIRE(back.appends.size() == 2);
  CHECK(back.appends[0].from == "test batch");
  CHECK(back.appends[1].count_after == 47);
}

TEST_CASE("append(A) then append(B) gives the records of one write of A + B", "[cache][append]") {
  TempDir parts, whole;
  Write(parts.path(), 0, 12, false);
  Write(parts.path(), 12, 25, true);
  Write(parts.path(), 25, 31, true);
  Write(whole.path(), 0, 31, false);
  std::unique_ptr<CacheReader> a, b;
  REQUIRE(CacheReader::Open(parts.path(), ReaderOptions(), &a).ok());
  REQUIRE(CacheReader::Open(whole.path(), ReaderOptions(), &b).ok());
  REQUIRE(a->size() == b->size());
  auto ta = a->BeginRead(), tb = b->BeginRead();
  for (uint64_t i = 0; i < 31; ++i) {
    RecordView va, vb;
    REQUIRE(ta->Get(i, &va).ok());
    REQUIRE(tb->Get(i, &vb).ok());
    INFO("record " << i);
    CHECK(va.label == vb.label);
    CHECK(va.checksum == vb.checksum);
    REQUIRE(va.bytes == vb.bytes);
    CHECK(std::memcmp(va.data, vb.data, va.bytes) == 0);
  }
  CHECK(a->manifest().classes == b->manifest().classes);
}

TEST_CASE("a reader open during an append reads the old records, one opened after reads all",
          "[cache][append]") {
  TempDir dir;
  Write(dir.path(), 0, 20, false);
  std::unique_ptr<CacheReader> early;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &early).ok());
  {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(Options(true), dir.path(), &w).ok());
    CHECK(w->append_base() == 20);
    for (uint64_t i = 20; i < 33; ++i) {
      auto p = TestPayload(i, DType::kUint8, kBytes);
      REQUIRE(w->Append(i, static_cast<int64_t>(i % 10), p.data()).ok());
    }
    REQUIRE(w->Commit().ok());
    // Mid-append: the manifest is the old one, and so is what a reader sees.
    std::unique_ptr<CacheReader> during;
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &during).ok());
    CHECK(during->size() == 20);
    VerifyReport rep;
    REQUIRE(VerifyCache(dir.path(), VerifyOptions(), &rep).ok());
    CHECK(rep.clean());
    CHECK(rep.records_checked == 20);
    REQUIRE(rep.notes.size() == 1);
    CHECK_THAT(rep.notes[0], Catch::Contains("an append in progress"));
    CHECK(std::filesystem::exists(dir / kAppendMarkerName));
    Manifest m;
    m.classes = Classes();
    REQUIRE(w->Finish(&m).ok());
  }
  CHECK_FALSE(std::filesystem::exists(dir / kAppendMarkerName));
  CHECK(early->size() == 20);
  auto txn = early->BeginRead();
  for (uint64_t i = 0; i < 20; ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, true).ok());
  }
  CheckRecords(dir.path(), 33);
}

TEST_CASE("an append killed at any of 20 moments resumes to the bytes of an uninterrupted one",
          "[cache][append]") {
  TempDir ref;
  Write(ref.path(), 0, 14, false);
  Write(ref.path(), 14, 40, true);  // 26 new records: shards 2 (4 records)... see below
  const std::vector<std::string> files = ShardFiles(ref.path());
  Manifest want;
  REQUIRE(ReadManifest(ref.path(), &want).ok());
  // Kill points: before the first record, after each of several records
  // (on and off the commit cadence, at shard boundaries), and after Finish.
  const std::vector<uint64_t> kill_after = {0,  1,  3,  4,  5,  8,  9,  12, 13, 16,
                                            17, 18, 20, 21, 22, 23, 24, 25, 26, 27};
  REQUIRE(kill_after.size() == 20);
  for (uint64_t k : kill_after) {
    INFO("killed after " << k << " appended records");
    TempDir dir;
    Write(dir.path(), 0, 14, false);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::unique_ptr<CacheWriter> w;
      if (!CacheWriter::Open(Options(true), dir.path(), &w).ok()) ::_exit(3);
      for (uint64_t i = 14; i < 40 && i - 14 < k; ++i) {
        auto p = TestPayload(i, DType::kUint8, kBytes);
        if (!w->Append(i, static_cast<int64_t>(i % 10), p.data()).ok()) ::_exit(4);
      }
      if (k == 27) {  // past the last record: killed right after the manifest is published
        Manifest m;
        m.classes = Classes();
        if (!w->Finish(&m).ok()) ::_exit(5);
      }
      ::raise(SIGKILL);
      ::_exit(6);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    // The old records stay readable and verified whatever the moment.
    Manifest now;
    REQUIRE(ReadManifest(dir.path(), &now).ok());
    if (k < 27) {
      CHECK(now.count == 14);
      CheckRecords(dir.path(), 14);
      // Resume: the writer continues after the last committed record.
      std::unique_ptr<CacheWriter> w;
      REQUIRE(CacheWriter::Open(Options(true), dir.path(), &w).ok());
      const uint64_t next = w->next_index();
      CHECK(next >= 14);
      CHECK(next <= 14 + k);
      for (uint64_t i = next; i < 40; ++i) {
        auto p = TestPayload(i, DType::kUint8, kBytes);
        REQUIRE(w->Append(i, static_cast<int64_t>(i % 10), p.data()).ok());
      }
      Manifest m;
      m.classes = Classes();
      REQUIRE(w->Finish(&m).ok());
    }
    CheckRecords(dir.path(), 40);
    CHECK(ShardFiles(dir.path()) == files);
    for (const std::string& f : files) {
      INFO(f);
      CHECK(ReadFile(dir / f) == ReadFile(ref / f));
    }
    Manifest got;
    REQUIRE(ReadManifest(dir.path(), &got).ok());
    REQUIRE(got.shards.size() == want.shards.size());
    for (size_t s = 0; s < got.shards.size(); ++s) {
      CHECK(got.shards[s].digest == want.shards[s].digest);
      CHECK(got.shards[s].bytes == want.shards[s].bytes);
    }
    REQUIRE(got.appends.size() == 1);
    CHECK(got.appends[0].count_before == 14);
    CHECK(got.appends[0].count_after == 40);
  }
}

TEST_CASE("an append that does not fit the cache is refused and leaves it as it was",
          "[cache][append]") {
  TempDir dir;
  Write(dir.path(), 0, 10, false);
  const std::string manifest = ReadFile(dir / "manifest.json");
  SECTION("another record shape") {
    WriterOptions o = Options(true);
    o.shape = MakeShape({3, 8, 8});
    std::unique_ptr<CacheWriter> w;
    const Status s = CacheWriter::Open(o, dir.path(), &w);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("cannot append") && Catch::Contains("4x8x8"));
  }
  SECTION("fields where the cache has format 1 records") {
    WriterOptions o = Options(true);
    FieldSpec image;
    image.name = "image";
    image.dtype = DType::kUint8;
    image.ndim = 3;
    image.dims = {4, 8, 8};
    o.fields = {image};
    std::unique_ptr<CacheWriter> w;
    const Status s = CacheWriter::Open(o, dir.path(), &w);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("format 1"));
  }
  SECTION("classes that do not begin with the cache's") {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(Options(true), dir.path(), &w).ok());
    auto p = TestPayload(10, DType::kUint8, kBytes);
    REQUIRE(w->Append(10, 0, p.data()).ok());
    Manifest m;
    m.classes = {"class1", "class0"};
    const Status s = w->Finish(&m);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("classes"));
  }
  SECTION("a directory that holds no finished cache") {
    TempDir empty;
    std::unique_ptr<CacheWriter> w;
    const Status s = CacheWriter::Open(Options(true), empty.path() + "/none", &w);
    CHECK_FALSE(s.ok());
  }
  CHECK(ReadFile(dir / "manifest.json") == manifest);
  CheckRecords(dir.path(), 10);
}

TEST_CASE("an append of no records leaves the cache as it was", "[cache][append]") {
  TempDir dir;
  Write(dir.path(), 0, 10, false);
  const std::string manifest = ReadFile(dir / "manifest.json");
  Write(dir.path(), 10, 10, true);
  CHECK(ReadFile(dir / "manifest.json") == manifest);
  CHECK(ShardFiles(dir.path()).size() == 2);
}

TEST_CASE("classes may grow by new names at the end of an append", "[cache][append]") {
  TempDir dir;
  Write(dir.path(), 0, 10, false);
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(Options(true), dir.path(), &w).ok());
  auto p = TestPayload(10, DType::kUint8, kBytes);
  REQUIRE(w->Append(10, 10, p.data()).ok());
  Manifest m;
  m.classes = Classes();
  m.classes.push_back("class10");
  REQUIRE(w->Finish(&m).ok());
  Manifest back;
  REQUIRE(ReadManifest(dir.path(), &back).ok());
  CHECK(back.classes.size() == 11);
  CHECK(back.count == 11);
}
