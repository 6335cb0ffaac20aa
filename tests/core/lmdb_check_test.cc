// CheckLmdbFile, kiln verify and CacheReader on shards whose LMDB pages are
// damaged: the damage is reported naming the shard, and LMDB never gets to
// crash the process on it.
#include "core/lmdb_check.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>

#include "kiln/cache_reader.h"
#include "kiln/verify.h"
#include "page_damage.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

constexpr size_t kPage = 4096;  // what LMDB writes on x86-64 Linux

template <typename T>
T Get(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
template <typename T>
void Put(std::string* b, size_t at, T v) {
  std::memcpy(&(*b)[at], &v, sizeof v);
}

// LMDB 0.9's layout, as far as the tests need it: the meta page with the
// larger transaction id, its main database's root and depth.
struct Tree {
  size_t meta, root, depth;
};
Tree ReadTree(const std::string& b) {
  const size_t meta = Get<uint64_t>(b, kPage + 16 + 128) > Get<uint64_t>(b, 16 + 128) ? 1 : 0;
  const size_t db = meta * kPage + 16 + 72;
  return {meta, static_cast<size_t>(Get<uint64_t>(b, db + 40)), Get<uint16_t>(b, db + 6)};
}
// Offset of node `i` of page `pgno`.
size_t Node(const std::string& b, size_t pgno, size_t i) {
  return pgno * kPage + Get<uint16_t>(b, pgno * kPage + 16 + 2 * i);
}
// The leaf page of the first key (a tree of depth 1 or 2).
size_t FirstLeaf(const std::string& b, const Tree& t) {
  if (t.depth == 1) return t.root;
  const size_t n = Node(b, t.root, 0);
  return Get<uint16_t>(b, n) | size_t{Get<uint16_t>(b, n + 2)} << 16;
}

std::string Verify(const std::string& dir, VerifyLevel level = VerifyLevel::kFull) {
  VerifyOptions o;
  o.level = level;
  VerifyReport r;
  REQUIRE(VerifyCache(dir, o, &r).ok());
  std::string all;
  for (const auto& p : r.problems) all += p.shard + ": " + p.what + "\n";
  return all;
}

}  // namespace

TEST_CASE("the LMDB structure check passes kiln's shards and counts their entries", "[core]") {
  TempDir dir;
  // 784-byte records sit in leaf pages (a tree of depth 2); 6 KiB records
  // go to overflow pages; the third cache has several shards.
  WriteTestCache(dir / "inline", 400, DType::kUint8, MakeShape({1, 28, 28}));
  WriteTestCache(dir / "overflow", 60, DType::kFloat16, MakeShape({3, 32, 32}));
  WriteTestCache(dir / "shards", 90, DType::kFloat16, MakeShape({3, 32, 32}), 10, 200000);
  uint64_t total = 0;
  for (const char* name : {"inline", "overflow", "shards"}) {
    for (const auto& e : fs::directory_iterator(dir / name)) {
      if (e.path().extension() != ".mdb") continue;
      LmdbFileSummary s;
      Status st = CheckLmdbFile(e.path(), fs::file_size(e.path()), &s);
      INFO(e.path() << ": " << st.ToString());
      REQUIRE(st.ok());
      CHECK(s.page_size == kPage);
      CHECK(s.entries > 0);
      total += s.entries;
      if (std::string(name) == "inline") CHECK(s.depth == 2);
    }
    CHECK(Verify(dir / name).empty());
  }
  CHECK(total == 400 + 60 + 90);
}

// Opens `dir` and reads every record as the loader does: "" if that
// worked, else the error. `records` gets the records' bytes and labels.
std::string ReadAll(const std::string& dir, std::vector<std::string>* records) {
  records->clear();
  std::unique_ptr<CacheReader> r;
  Status s = CacheReader::Open(dir, ReaderOptions(), &r);
  if (!s.ok()) return s.ToString();
  auto txn = r->BeginRead();
  for (uint64_t i = 0; i < r->manifest().count; ++i) {
    RecordView v;
    s = txn->Get(i, &v);
    if (!s.ok()) return s.ToString();
    records->push_back(std::string(reinterpret_cast<const char*>(v.data), v.bytes) + "/" +
                       std::to_string(v.label));
  }
  return "";
}

// "" if `got` equals `want`, else the first record that differs.
std::string FirstDifference(const std::vector<std::string>& got,
                            const std::vector<std::string>& want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " records, not " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return "record " + std::to_string(i) + " differs";
  return "";
}

TEST_CASE("kiln verify and every reader name damaged LMDB pages instead of crashing in LMDB",
          "[core]") {
  TempDir dir;
  WriteTestCache(dir / "good", 400, DType::kUint8, MakeShape({1, 28, 28}));
  WriteTestCache(dir / "big", 60, DType::kFloat16, MakeShape({3, 32, 32}));
  const std::string good = ReadFile(dir / "good/shard-00000.mdb");
  const std::string big = ReadFile(dir / "big/shard-00000.mdb");
  const Tree t = ReadTree(good), tb = ReadTree(big);
  REQUIRE(t.depth == 2);
  REQUIRE(tb.depth >= 1);
  const size_t first_leaf = FirstLeaf(good, t);

  struct Case {
    std::string name;
    bool overflow_cache;
    std::function<void(std::string*)> damage;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"the meta's last page past the end", false,
       [&](std::string* b) { Put<uint64_t>(b, t.meta * kPage + 16 + 120, 1u << 20); },
       "last page 1048576 is not inside the file"},
      {"a branch node pointing past the tree", false,
       [&](std::string* b) { Put<uint16_t>(b, Node(*b, t.root, 1) + 2, 0x7fff); }, "outside pages"},
      {"a branch node pointing at a meta page", false,
       [&](std::string* b) {
         Put<uint16_t>(b, Node(*b, t.root, 1), 1);
         Put<uint16_t>(b, Node(*b, t.root, 1) + 2, 0);
       },
       "points to page 1, outside"},
      {"two branch nodes pointing at one leaf", false,
       [&](std::string* b) {
         Put<uint32_t>(b, Node(*b, t.root, 1), Get<uint32_t>(*b, Node(*b, t.root, 0)));
       },
       "reached before"},
      {"the root marked as an overflow page", false,
       [&](std::string* b) { Put<uint16_t>(b, t.root * kPage + 10, 0x04); }, "not a branch page"},
      {"a node offset inside the page header", false,
       [&](std::string* b) { Put<uint16_t>(b, first_leaf * kPage + 16, 4); }, "node 0 at offset 4"},
      {"a value longer than its page", false,
       [&](std::string* b) { Put<uint16_t>(b, Node(*b, first_leaf, 0), 0xfff0); },
       "runs past the page"},
      {"a leaf header naming another page", false,
       [&](std::string* b) { Put<uint64_t>(b, first_leaf * kPage, first_leaf + 1000); },
       "its header says page " + std::to_string(first_leaf + 1000)},
      {"an overflow value pointing at a tree page", true,
       [&](std::string* b) {
         const size_t n = Node(*b, FirstLeaf(*b, tb), 0);
         REQUIRE(Get<uint16_t>(*b, n + 4) == 1);  // F_BIGDATA
         Put<uint64_t>(b, n + 8 + Get<uint16_t>(*b, n + 6), tb.root);
       },
       "reached before"},
      {"an overflow value longer than the file", true,
       [&](std::string* b) {
         Put<uint16_t>(b, Node(*b, FirstLeaf(*b, tb), 0) + 2, 0x7000);  // about 1.8 GB
       },
       "outside pages"},
  };
  for (const auto& c : cases) {
    const std::string cache = dir / (c.overflow_cache ? "big" : "good");
    std::string bytes = c.overflow_cache ? big : good;
    c.damage(&bytes);
    WriteFile(cache + "/shard-00000.mdb", bytes);
    for (VerifyLevel level : {VerifyLevel::kQuick, VerifyLevel::kFull}) {
      const std::string problems = Verify(cache, level);
      INFO(c.name << ":\n" << problems);
      CHECK_THAT(problems, Catch::StartsWith("shard-00000.mdb: ") &&
                               Catch::Contains("LMDB structure damaged") &&
                               Catch::Contains(c.expect) &&
                               Catch::Contains("cannot be read safely"));
    }
    // Every reader (kiln train, bench, kiln.Cache, kiln.Loader) opens
    // through CacheReader::Open, which walks the tree first.
    std::unique_ptr<CacheReader> r;
    const Status s = CacheReader::Open(cache, ReaderOptions(), &r);
    INFO(c.name << ": " << s.ToString());
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains(cache + "/shard-00000.mdb") &&
                                Catch::Contains("LMDB structure damaged") &&
                                Catch::Contains(c.expect) && Catch::Contains("kiln build --force"));
  }
}

TEST_CASE("300 seeded damaged page headers: readers name the shard, none crashes", "[core]") {
  // The sample cache's shape (300 float16 1x28x28 records, two to a leaf
  // page) and one whose records lie on overflow pages. Before readers
  // walked the tree at open, kiln bench and kiln.Loader died by signal in 2
  // of 150 such tries each, kiln verify in 14 of 200 before it walked it.
  TempDir dir;
  struct Shard {
    std::string name;
    int tries;
    bool payload_at_page_starts;  // pages that begin inside a record's payload
  };
  WriteTestCache(dir / "sample", 300, DType::kFloat16, MakeShape({1, 28, 28}));
  WriteTestCache(dir / "overflow", 60, DType::kFloat16, MakeShape({3, 32, 32}));
  for (const Shard& c : {Shard{"sample", 300, false}, Shard{"overflow", 100, true}}) {
    const std::string cache = dir / c.name, shard = cache + "/shard-00000.mdb";
    const std::string good = ReadFile(shard);
    std::vector<std::string> want, got;
    REQUIRE(ReadAll(cache, &want) == "");
    int structure = 0, clean = 0, refused = 0, changed = 0;
    for (int seed = 1; seed <= c.tries; ++seed) {
      std::string bytes = good;
      const uint64_t page = DamagePageHeader(&bytes, seed);
      WriteFile(shard, bytes);
      const std::string problems = Verify(cache);
      const std::string error = ReadAll(cache, &got);
      INFO(c.name << " seed " << seed << ", page " << page << ": " << error << "\n" << problems);
      clean += problems.empty();
      structure += problems.find("LMDB structure damaged") != std::string::npos;
      if (!error.empty()) {
        ++refused;
        CHECK_THAT(error, Catch::Contains(shard));
      } else if (const std::string diff = FirstDifference(got, want); !diff.empty()) {
        // Bytes inside a payload (an overflow value's later pages): readers
        // recompute no checksums by default, kiln verify does.
        ++changed;
        CHECK(c.payload_at_page_starts);
        CHECK_THAT(problems, Catch::Contains("checksum"));
      }
      // What verify finds clean, readers read.
      if (problems.empty()) CHECK(error.empty());
    }
    INFO(c.name << ": " << structure << " structure reports, " << clean << " clean, " << refused
                << " refused by readers, " << changed << " read with a changed payload of "
                << c.tries);
    CHECK(structure > 0);
    CHECK(clean < c.tries);
    CHECK(refused > 0);
  }
}

TEST_CASE("readers trust an overflow value's pages to its node as LMDB does: verify reads them",
          "[core]") {
  TempDir dir;
  WriteTestCache(dir / "c", 60, DType::kFloat16, MakeShape({3, 32, 32}));
  const std::string shard = dir / "c/shard-00000.mdb";
  std::string bytes = ReadFile(shard);
  std::vector<std::string> want, got;
  REQUIRE(ReadAll(dir / "c", &want) == "");
  // The first value's first overflow page, marked as a leaf page: LMDB
  // reads the value at page + 16 bytes without looking at that header.
  const size_t n = Node(bytes, FirstLeaf(bytes, ReadTree(bytes)), 0);
  REQUIRE(Get<uint16_t>(bytes, n + 4) == 1);  // F_BIGDATA
  const uint64_t first = Get<uint64_t>(bytes, n + 8 + Get<uint16_t>(bytes, n + 6));
  Put<uint16_t>(&bytes, first * kPage + 10, 0x02);
  WriteFile(shard, bytes);
  LmdbFileSummary s;
  CHECK(CheckLmdbFile(shard, bytes.size(), &s).ok());
  CHECK(ReadAll(dir / "c", &got) == "");
  CHECK(FirstDifference(got, want) == "");
  // kiln verify reads that header where it reads the value, at both levels.
  for (VerifyLevel level : {VerifyLevel::kQuick, VerifyLevel::kFull})
    CHECK_THAT(Verify(dir / "c", level), Catch::Contains("page " + std::to_string(first) +
                                                         ": not the overflow page of 2 pages"));
}

TEST_CASE("opening a cache refuses a shard whose LMDB meta pages are damaged", "[core]") {
  TempDir dir;
  WriteTestCache(dir / "c", 40, DType::kUint8, MakeShape({1, 28, 28}));
  const std::string shard = dir / "c/shard-00000.mdb", good = ReadFile(shard);
  const Tree t = ReadTree(good);
  struct Case {
    std::string name;
    std::function<void(std::string*)> damage;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"the last page past the end",
       [&](std::string* b) { Put<uint64_t>(b, t.meta * kPage + 16 + 120, 1u << 20); },
       "last page 1048576"},
      {"the root on a meta page",
       [&](std::string* b) { Put<uint64_t>(b, t.meta * kPage + 16 + 112, 1); },
       "the root is page 1"},
      {"the newest transaction on the wrong meta page",
       [&](std::string* b) { Put<uint64_t>(b, (1 - t.meta) * kPage + 16 + 128, 1000 + t.meta); },
       "which LMDB writes to meta page"},
      {"no magic number", [&](std::string* b) { (*b)[16] ^= 1; }, "meta page 0 lacks"},
  };
  for (const auto& c : cases) {
    std::string bytes = good;
    c.damage(&bytes);
    WriteFile(shard, bytes);
    std::unique_ptr<CacheReader> r;
    Status s = CacheReader::Open(dir / "c", ReaderOptions(), &r);
    INFO(c.name << ": " << s.ToString());
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains(shard) && Catch::Contains("LMDB structure damaged") &&
                                Catch::Contains(c.expect) && Catch::Contains("kiln build --force"));
  }
  WriteFile(shard, good);
  std::unique_ptr<CacheReader> r;
  CHECK(CacheReader::Open(dir / "c", ReaderOptions(), &r).ok());
}
