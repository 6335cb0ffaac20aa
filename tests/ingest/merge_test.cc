// kiln merge: parts built apart join into what a one-part build writes;
// missing, unfinished or different parts are named.
#include <catch2/catch.hpp>
#include <filesystem>
#include <tuple>

#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "ingest_test_util.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {
// Every record of a finished cache: (label, checksum, payload bytes).
std::vector<std::tuple<int64_t, uint64_t, std::string>> Records(const std::string& dir) {
  std::unique_ptr<CacheReader> r;
  Status s = CacheReader::Open(dir, ReaderOptions(), &r);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto txn = r->BeginRead();
  std::vector<std::tuple<int64_t, uint64_t, std::string>> out;
  for (uint64_t i = 0; i < r->size(); ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, true).ok());
    out.emplace_back(v.label, v.checksum, std::string(reinterpret_cast<const char*>(v.data), v.bytes));
    txn->Reset();
  }
  return out;
}

std::string RecipeText(const std::string& dir) {
  Manifest m;
  REQUIRE(ReadManifest(dir, &m).ok());
  return m.preprocessing.ToJson();
}
}  // namespace

TEST_CASE("parts built apart and merged equal a one-part build, record for record", "[build][merge]") {
  TempDir one, parts;
  std::string log;
  const std::string opts = " --channels 1 --shard-size 64K --progress none";
  REQUIRE(Kiln("build " + kFashion + " " + one.path() + opts, &log) == 0);
  for (int i = 0; i < 3; ++i)
    REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --num-parts 3 --part " +
                     std::to_string(i), &log) == 0);
  REQUIRE(fs::exists(parts / "part-00002-of-00003/manifest.json"));
  // A part verifies on its own, but is not trained on before the merge.
  CHECK(Kiln("verify " + parts / "part-00001-of-00003", &log) == 0);
  CHECK(Kiln("inspect " + parts / "part-00001-of-00003", &log) == 0);
  std::unique_ptr<CacheReader> reader;
  CHECK(CacheReader::Open(parts / "part-00001-of-00003", ReaderOptions(), &reader).IsNotSupported());

  const auto inode = fs::hard_link_count(parts / "part-00000-of-00003/shard-00000.mdb");
  CHECK(inode == 1);
  REQUIRE(Kiln("merge " + parts.path(), &log) == 0);
  CHECK_THAT(log, Catch::Contains("no tensor data copied"));
  CHECK_FALSE(fs::exists(parts / "part-00000-of-00003"));  // the parts are gone: their shards live on
  CHECK(Records(parts.path()) == Records(one.path()));
  CHECK(RecipeText(parts.path()) == RecipeText(one.path()));
  CHECK(ReadFile(parts / "sources.tsv") == ReadFile(one / "sources.tsv"));
  CHECK(Kiln("verify " + parts.path() + " --level sources", &log) == 0);
  // The one-part command sees the merged cache as its own.
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date"));
  // And repairs it: a damaged record is rewritten to the one-part bytes.
  std::string payload, shard;
  {
    std::unique_ptr<CacheReader> merged;
    REQUIRE(CacheReader::Open(parts.path(), ReaderOptions(), &merged).ok());
    RecordView v;
    REQUIRE(merged->BeginRead()->Get(merged->size() - 1, &v).ok());
    payload.assign(reinterpret_cast<const char*>(v.data), 64);
    shard = parts / merged->manifest().shards.back().file;
  }
  std::string bytes = ReadFile(shard);
  const size_t at = bytes.find(payload);
  REQUIRE(at != std::string::npos);
  bytes[at + 10] ^= 0x10;
  WriteFile(shard, bytes);
  CHECK(Kiln("verify " + parts.path(), &log) == 1);
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --repair", &log) == 0);
  CHECK(Kiln("verify " + parts.path(), &log) == 0);
  CHECK(Records(parts.path()) == Records(one.path()));
}

TEST_CASE("parts from the launcher's environment, with a validation split", "[build][merge]") {
  TempDir one, parts;
  std::string log;
  const std::string opts = " --channels 1 --val-fraction 0.2 --progress none";
  REQUIRE(Kiln("build " + kFashion + " " + one.path() + opts, &log) == 0);
  REQUIRE(RunCommand("RANK=0 WORLD_SIZE=2 " + std::string(KILN_BIN) + " build " + kFashion + " " +
                         parts.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("part 0 of 2 (from RANK/WORLD_SIZE)"));
  REQUIRE(RunCommand("SLURM_PROCID=1 SLURM_NTASKS=2 " + std::string(KILN_BIN) + " build " +
                         kFashion + " " + parts.path() + opts, &log) == 0);
  REQUIRE(fs::exists(parts / "train/part-00001-of-00002/manifest.json"));
  REQUIRE(fs::exists(parts / "val/part-00000-of-00002/manifest.json"));
  REQUIRE(Kiln("merge " + parts.path(), &log) == 0);
  for (const char* split : {"train", "val"}) {
    INFO(split);
    CHECK(Records(parts / split) == Records(one / split));
  }
  CHECK(RunCommand("RANK=3 WORLD_SIZE=2 " + std::string(KILN_BIN) + " build " + kFashion + " " +
                       parts.path() + "/x" + opts, &log) == 2);
}

TEST_CASE("merge names a missing, unfinished or different part", "[build][merge]") {
  TempDir parts;
  std::string log;
  const std::string opts = " --channels 1 --progress none --num-parts 3";
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --part 0", &log) == 0);
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --part 2", &log) == 0);
  CHECK(Kiln("merge " + parts.path(), &log) == 2);
  CHECK_THAT(log, Catch::Contains("part 1 of 3 is missing") && Catch::Contains("--part 1"));
  // A part built with other options.
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --part 1 --dtype float32", &log) == 0);
  CHECK(Kiln("merge " + parts.path(), &log) == 2);
  CHECK_THAT(log, Catch::Contains("part-00001-of-00003 was built differently") &&
                      Catch::Contains("dtype"));
  // An unfinished part (no manifest yet).
  REQUIRE(Kiln("build " + kFashion + " " + parts.path() + opts + " --part 1 --force", &log) == 0);
  fs::remove(parts / "part-00001-of-00003/manifest.json");
  CHECK(Kiln("merge " + parts.path(), &log) == 1);
  CHECK_THAT(log, Catch::Contains("part-00001-of-00003") && Catch::Contains("did not finish"));
  CHECK_FALSE(fs::exists(parts / "manifest.json"));
  CHECK(Kiln("build " + kFashion + " " + parts.path() + " --channels 1 --num-parts 3 --part 3", &log) == 2);
}

TEST_CASE("merge re-indexes the parts after one that rejected inputs", "[build][merge]") {
  TempDir src, one, parts;
  // Two classes of photos, with a broken file early in the sorted order.
  MakePhotoFolder(src.path(), 3);
  WriteFile(src / "cats/0_broken.jpg", "not a jpeg at all\n");
  std::string log;
  const std::string opts = " --resize 32 --crop 32 --progress none";
  REQUIRE(Kiln("build " + src.path() + " " + one.path() + opts, &log) == 0);
  for (int i = 0; i < 2; ++i)
    REQUIRE(Kiln("build " + src.path() + " " + parts.path() + opts + " --num-parts 2 --part " +
                     std::to_string(i), &log) == 0);
  REQUIRE(Kiln("merge " + parts.path(), &log) == 0);
  CHECK_THAT(log, Catch::Contains("rewriting its") && Catch::Contains("records rewritten"));
  CHECK(Records(parts.path()) == Records(one.path()));
  CHECK(ReadFile(parts / "sources.tsv") == ReadFile(one / "sources.tsv"));
  CHECK(ReadFile(parts / "rejects.tsv") == ReadFile(one / "rejects.tsv"));
  CHECK(Kiln("verify " + parts.path() + " --level sources", &log) == 0);
}
