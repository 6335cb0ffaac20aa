// MergeParts: parts built apart join into what a one-part build writes;
// missing, unfinished or different parts are named. The command's part
// from the launcher's environment and its summary: tests/tools.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "ingest_test_util.h"
#include "kiln/cache_reader.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
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
    out.emplace_back(v.label, v.checksum,
                     std::string(reinterpret_cast<const char*>(v.data), v.bytes));
    txn->Reset();
  }
  return out;
}

std::string RecipeText(const std::string& dir) {
  Manifest m;
  REQUIRE(ReadManifest(dir, &m).ok());
  return m.preprocessing.ToJson();
}

// One MergeParts call of the parts found in OUT: its Status, result and lines.
struct Merged {
  Status status;
  ingest::MergeResult result;
  std::string log;
};

Merged Merge(const std::string& out) {
  Merged m;
  m.status = ingest::MergeParts(
      out, {}, /*keep_parts=*/false, [&m](const std::string& l) { m.log += l + "\n"; }, &m.result);
  return m;
}

// Builds part `part` of `num_parts` of the build `o`.
Built BuildPart(ingest::BuildOptions o, int part, int num_parts) {
  o.part = part;
  o.num_parts = num_parts;
  return Build(o);
}
}  // namespace

TEST_CASE("parts built apart and merged equal a one-part build, record for record",
          "[build][merge]") {
  TempDir one, parts;
  ingest::BuildOptions o = BuildOf(kFashion, one.path());
  o.channels = 1;
  o.shard_size = 64 << 10;
  REQUIRE(Build(o).status.ToString() == "OK");
  o.out = parts.path();
  for (int i = 0; i < 3; ++i) REQUIRE(BuildPart(o, i, 3).status.ToString() == "OK");
  REQUIRE(fs::exists(parts / "part-00002-of-00003/manifest.json"));
  // A part verifies on its own and can be looked at, but is not trained on
  // before the merge.
  CHECK(Problems(parts / "part-00001-of-00003") == "");
  ReaderOptions look;
  look.allow_part = true;
  std::unique_ptr<CacheReader> reader;
  CHECK(CacheReader::Open(parts / "part-00001-of-00003", look, &reader).ok());
  CHECK(
      CacheReader::Open(parts / "part-00001-of-00003", ReaderOptions(), &reader).IsNotSupported());

  const auto inode = fs::hard_link_count(parts / "part-00000-of-00003/shard-00000.mdb");
  CHECK(inode == 1);
  const Merged m = Merge(parts.path());
  REQUIRE(m.status.ToString() == "OK");
  CHECK(m.result.copied_records == 0);  // every shard hard-linked
  CHECK(m.result.parts == 3);
  CHECK(m.result.records == 300);
  CHECK_FALSE(
      fs::exists(parts / "part-00000-of-00003"));  // the parts are gone: their shards live on
  CHECK(Records(parts.path()) == Records(one.path()));
  CHECK(RecipeText(parts.path()) == RecipeText(one.path()));
  CHECK(ReadFile(parts / "sources.tsv") == ReadFile(one / "sources.tsv"));
  CHECK(SourceProblems(parts.path(), ingest::SourceCheck::kSources) == "");
  // The one-part build sees the merged cache as its own.
  const Built again = Build(o);
  REQUIRE(again.status.ToString() == "OK");
  CHECK(again.result.up_to_date);
  CHECK_THAT(again.log, Catch::Contains("up to date"));
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
  VerifyReport damaged;
  REQUIRE(VerifyCache(parts.path(), VerifyOptions(), &damaged).ok());
  CHECK_FALSE(damaged.clean());
  o.repair = true;
  REQUIRE(Build(o).status.ToString() == "OK");
  CHECK(Problems(parts.path()) == "");
  CHECK(Records(parts.path()) == Records(one.path()));
}

TEST_CASE("parts with a validation split merge into both splits", "[build][merge]") {
  TempDir one, parts;
  ingest::BuildOptions o = BuildOf(kFashion, one.path());
  o.channels = 1;
  o.val_fraction = 0.2;
  REQUIRE(Build(o).status.ToString() == "OK");
  o.out = parts.path();
  REQUIRE(BuildPart(o, 0, 2).status.ToString() == "OK");
  REQUIRE(BuildPart(o, 1, 2).status.ToString() == "OK");
  REQUIRE(fs::exists(parts / "train/part-00001-of-00002/manifest.json"));
  REQUIRE(fs::exists(parts / "val/part-00000-of-00002/manifest.json"));
  const Merged m = Merge(parts.path());
  REQUIRE(m.status.ToString() == "OK");
  CHECK(m.result.caches == std::vector<std::string>{parts / "train", parts / "val"});
  for (const char* split : {"train", "val"}) {
    INFO(split);
    CHECK(Records(parts / split) == Records(one / split));
  }
}

TEST_CASE("merge names a missing, unfinished or different part", "[build][merge]") {
  TempDir parts;
  ingest::BuildOptions o = BuildOf(kFashion, parts.path());
  o.channels = 1;
  REQUIRE(BuildPart(o, 0, 3).status.ToString() == "OK");
  REQUIRE(BuildPart(o, 2, 3).status.ToString() == "OK");
  const Merged missing = Merge(parts.path());
  CHECK(missing.status.IsNotFound());
  CHECK_THAT(missing.status.message(),
             Catch::Contains("part 1 of 3 is missing") && Catch::Contains("--part 1"));
  // A part built with other options.
  ingest::BuildOptions f32 = o;
  f32.dtype = DType::kFloat32;
  REQUIRE(BuildPart(f32, 1, 3).status.ToString() == "OK");
  const Merged different = Merge(parts.path());
  CHECK(different.status.IsInvalidArgument());
  CHECK_THAT(
      different.status.message(),
      Catch::Contains("part-00001-of-00003 was built differently") && Catch::Contains("dtype"));
  // An unfinished part (no manifest yet).
  o.force = true;
  REQUIRE(BuildPart(o, 1, 3).status.ToString() == "OK");
  fs::remove(parts / "part-00001-of-00003/manifest.json");
  const Merged unfinished = Merge(parts.path());
  CHECK(unfinished.status.IsCorruption());
  CHECK_THAT(unfinished.status.message(),
             Catch::Contains("part-00001-of-00003") && Catch::Contains("did not finish"));
  CHECK_FALSE(fs::exists(parts / "manifest.json"));
  CHECK(BuildPart(o, 3, 3).status.IsInvalidArgument());
}

TEST_CASE("merge re-indexes the parts after one that rejected inputs", "[build][merge]") {
  // Fixed-size records, and JPEG records in packs.
  const bool encoded = GENERATE(false, true);
  INFO((encoded ? "--max-side 48 --encode jpeg" : "--resize 32 --crop 32"));
  TempDir src, one, parts;
  // Two classes of photos, with a broken file early in the sorted order.
  MakePhotoFolder(src.path(), 3);
  WriteFile(src / "cats/0_broken.jpg", "not a jpeg at all\n");
  ingest::BuildOptions o = BuildOf(src.path(), one.path());
  if (encoded) {
    o.max_side = 48;
    o.dtype = DType::kUint8;
    o.encode = "jpeg";
  } else {
    o.resize = 32;
    o.crop = 32;
  }
  REQUIRE(Build(o).status.ToString() == "OK");
  o.out = parts.path();
  for (int i = 0; i < 2; ++i) REQUIRE(BuildPart(o, i, 2).status.ToString() == "OK");
  const Merged m = Merge(parts.path());
  REQUIRE(m.status.ToString() == "OK");
  CHECK_THAT(m.log, Catch::Contains("rewriting its"));
  CHECK(m.result.copied_records > 0);
  CHECK(Records(parts.path()) == Records(one.path()));
  CHECK(ReadFile(parts / "sources.tsv") == ReadFile(one / "sources.tsv"));
  CHECK(ReadFile(parts / "rejects.tsv") == ReadFile(one / "rejects.tsv"));
  CHECK(SourceProblems(parts.path(), ingest::SourceCheck::kSources) == "");
  if (encoded) {
    Manifest merged;
    REQUIRE(ReadManifest(parts.path(), &merged).ok());
    CHECK(merged.pack_bytes > 0);
    bool packed = false;
    for (const ShardInfo& sh : merged.shards) packed = packed || sh.packed();
    CHECK(packed);
    CHECK(Problems(parts.path()) == "");
  }
}
