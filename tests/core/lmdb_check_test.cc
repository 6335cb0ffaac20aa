// CheckLmdbFile and kiln verify on shards whose LMDB pages are damaged: the
// damage is reported naming the shard, and LMDB never gets to crash the
// process on it.
#include "core/lmdb_check.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "kiln/cache_reader.h"
#include "kiln/verify.h"
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

TEST_CASE("kiln verify names damaged LMDB pages instead of crashing in LMDB", "[core]") {
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
  }

  // Seeded random damage to page headers and node arrays, where LMDB
  // itself crashed before (14 of 200 tries): every try ends in a report,
  // clean only if every record still verifies.
  std::mt19937_64 rng(20261204);
  int structure = 0, clean = 0;
  const size_t pages = good.size() / kPage;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes[(rng() % pages) * kPage + rng() % 64] = static_cast<char>(rng());
    WriteFile(dir / "good/shard-00000.mdb", bytes);
    const std::string problems = Verify(dir / "good");
    if (problems.empty()) ++clean;
    if (problems.find("LMDB structure damaged") != std::string::npos) ++structure;
  }
  INFO(structure << " structure reports, " << clean << " clean of 300");
  CHECK(structure > 0);
  CHECK(clean < 300);
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
