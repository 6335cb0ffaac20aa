// Damaged caches: the reader, `kiln inspect` and `kiln verify` must report
// each case clearly, naming the record, and never crash or return garbage.
#include <lmdb.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/lmdb_env.h"
#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
const Shape kShape = MakeShape({3, 16, 16});
constexpr uint64_t kRecordBytes = 3 * 16 * 16 * 2;
constexpr uint64_t kCount = 60;

// 60 float16 records, 20 per shard.
void MakeCache(const TempDir& dir) {
  WriteTestCache(dir.path(), kCount, DType::kFloat16, kShape, 10, kRecordBytes * 20);
}

// Offset of record i's payload inside its shard file.
size_t PayloadOffset(const std::string& file_bytes, uint64_t i) {
  return kiln::testing::PayloadOffset(file_bytes, i, DType::kFloat16, kRecordBytes);
}

// Runs `fn` on a write transaction of the given shard, then restores the
// manifest's view of that shard's size so only the record damage shows.
template <typename Fn>
void EditShard(const std::string& path, Fn fn) {
  LmdbEnv env;
  REQUIRE(env.OpenForWrite(path, 64 << 20).ok());
  LmdbTxn txn;
  REQUIRE(txn.Begin(env, false).ok());
  fn(txn.get(), env.dbi());
  REQUIRE(txn.Commit().ok());
}

MDB_val GetValue(MDB_txn* txn, MDB_dbi dbi, uint64_t i, std::string* copy) {
  uint8_t key[8];
  EncodeKey(i, key);
  MDB_val k{8, key}, v;
  REQUIRE(mdb_get(txn, dbi, &k, &v) == MDB_SUCCESS);
  copy->assign(static_cast<char*>(v.mv_data), v.mv_size);
  return v;
}

void PutValue(MDB_txn* txn, MDB_dbi dbi, uint64_t i, const std::string& value) {
  uint8_t key[8];
  EncodeKey(i, key);
  MDB_val k{8, key}, v{value.size(), const_cast<char*>(value.data())};
  REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == MDB_SUCCESS);
}

VerifyReport Verify(const TempDir& dir, VerifyLevel level = VerifyLevel::kFull) {
  VerifyOptions o;
  o.level = level;
  VerifyReport r;
  REQUIRE(VerifyCache(dir.path(), o, &r).ok());
  return r;
}

bool Names(const VerifyReport& r, int64_t index, const std::string& what) {
  for (const auto& p : r.problems)
    if (p.index == index && p.what.find(what) != std::string::npos) return true;
  return false;
}

std::string Dump(const VerifyReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += std::to_string(p.index) + " [" + p.shard + "] " + p.what + "\n";
  return s;
}

}  // namespace

TEST_CASE("a clean cache verifies and inspects", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  CHECK(Verify(dir, VerifyLevel::kQuick).clean());
  CHECK(Verify(dir).clean());
}

TEST_CASE("one payload byte flipped", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  const std::string shard = dir / "shard-00001.mdb";
  FlipByte(shard, PayloadOffset(ReadFile(shard), 25) + 100);
  VerifyReport r = Verify(dir);
  INFO(Dump(r));
  CHECK(Names(r, 25, "checksum mismatch"));
  CHECK(r.problems.size() == 1);
  CHECK(Verify(dir, VerifyLevel::kQuick).clean());  // quick does not read payloads
  // The reader with checksums refuses it, naming the record and shard.
  std::unique_ptr<CacheReader> reader;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
  RecordView v;
  Status s = reader->BeginRead()->Get(25, &v, true);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("record 25") && Catch::Contains("shard-00001.mdb"));
}

TEST_CASE("one header byte flipped", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  const std::string shard = dir / "shard-00000.mdb";
  const size_t header = PayloadOffset(ReadFile(shard), 7) - kRecordHeaderSize;
  SECTION("the label byte: caught by the checksum") {
    FlipByte(shard, header + 24);
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(Names(r, 7, "checksum"));
  }
  SECTION("the magic: caught by the quick level and by the reader") {
    FlipByte(shard, header + 1);
    VerifyReport r = Verify(dir, VerifyLevel::kQuick);
    INFO(Dump(r));
    CHECK(Names(r, 7, "magic"));
    std::unique_ptr<CacheReader> reader;
    REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &reader).ok());
    RecordView v;
    CHECK(reader->BeginRead()->Get(7, &v).IsCorruption());
  }
}

TEST_CASE("record-level damage through LMDB", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  const std::string shard = dir / "shard-00002.mdb";
  SECTION("a label out of range, checksum intact") {
    EditShard(shard, [](MDB_txn* txn, MDB_dbi dbi) {
      std::string v;
      GetValue(txn, dbi, 44, &v);
      auto* h = reinterpret_cast<uint8_t*>(v.data());
      EncodeRecordHeader(44, DType::kFloat16, kShape, 99, h + kRecordHeaderSize, h);
      PutValue(txn, dbi, 44, v);
    });
    VerifyReport r = Verify(dir, VerifyLevel::kQuick);
    INFO(Dump(r));
    CHECK(Names(r, 44, "label 99"));
  }
  SECTION("two records' values swapped") {
    EditShard(shard, [](MDB_txn* txn, MDB_dbi dbi) {
      std::string a, b;
      GetValue(txn, dbi, 41, &a);
      GetValue(txn, dbi, 48, &b);
      PutValue(txn, dbi, 41, b);
      PutValue(txn, dbi, 48, a);
    });
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(Names(r, 41, "checksum"));
    CHECK(Names(r, 48, "checksum"));
  }
  SECTION("a record deleted") {
    EditShard(shard, [](MDB_txn* txn, MDB_dbi dbi) {
      uint8_t key[8];
      EncodeKey(50, key);
      MDB_val k{8, key};
      REQUIRE(mdb_del(txn, dbi, &k, nullptr) == MDB_SUCCESS);
    });
    VerifyReport r = Verify(dir, VerifyLevel::kQuick);
    INFO(Dump(r));
    CHECK(Names(r, 50, "record missing"));
    // The reader refuses the shard at open (record count).
    std::unique_ptr<CacheReader> reader;
    CHECK(CacheReader::Open(dir.path(), ReaderOptions(), &reader).IsCorruption());
  }
}

TEST_CASE("shard files damaged or missing", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  SECTION("truncated") {
    REQUIRE(truncate((dir / "shard-00001.mdb").c_str(), 20000) == 0);
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(!r.clean());
    CHECK(r.problems[0].shard == "shard-00001.mdb");
    CHECK_THAT(r.problems[0].what, Catch::Contains("truncated"));
    std::unique_ptr<CacheReader> reader;
    Status s = CacheReader::Open(dir.path(), ReaderOptions(), &reader);
    CHECK_THAT(s.message(), Catch::Contains("truncated"));
  }
  SECTION("missing") {
    std::filesystem::remove(dir / "shard-00002.mdb");
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(Names(r, 40, "shard file missing"));
  }
  SECTION("an extra unexpected shard") {
    std::filesystem::copy_file(dir / "shard-00000.mdb", dir / "shard-00003.mdb");
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].shard == "shard-00003.mdb");
    CHECK_THAT(r.problems[0].what, Catch::Contains("unexpected"));
  }
}

TEST_CASE("the manifest edited or missing", "[corruption]") {
  TempDir dir;
  MakeCache(dir);
  std::string m = ReadFile(dir / "manifest.json");
  SECTION("count edited") {
    m.replace(m.find("\"count\": 60"), 11, "\"count\": 61");
    WriteFile(dir / "manifest.json", m);
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(!r.clean());
    CHECK_THAT(r.problems[0].what, Catch::Contains("count"));
  }
  SECTION("a shard digest edited") {
    const size_t at = m.find("\"digest\": \"") + 11;
    m[at] = m[at] == '0' ? '1' : '0';
    WriteFile(dir / "manifest.json", m);
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].shard == "shard-00000.mdb");
    CHECK_THAT(r.problems[0].what, Catch::Contains("digest"));
  }
  SECTION("class names or preprocessing edited") {
    const std::string original = m;
    m.replace(m.find("\"class0\""), 8, "\"classX\"");
    WriteFile(dir / "manifest.json", m);
    VerifyReport r = Verify(dir, VerifyLevel::kQuick);
    INFO(Dump(r));
    REQUIRE(!r.clean());
    CHECK_THAT(r.problems[0].what, Catch::Contains("classes") && Catch::Contains("meta_digest"));
    std::unique_ptr<CacheReader> reader;
    CHECK(CacheReader::Open(dir.path(), ReaderOptions(), &reader).IsCorruption());
    // A manifest without the digest (an older kiln's) is read as before.
    std::string old = original;  // its line, "meta_digest": "...", (keys after it follow)
    const size_t at = old.find("  \"meta_digest\"");
    REQUIRE(at != std::string::npos);
    old.erase(at, old.find('\n', at) + 1 - at);
    WriteFile(dir / "manifest.json", old);
    CHECK(Verify(dir).clean());
  }
  SECTION("a shard's count edited to 2^40") {
    // Regression: verify reserved room for the manifest's count (2^40
    // records: std::bad_alloc out of VerifyCache) and then reported each
    // missing record on its own.
    nlohmann::json j = nlohmann::json::parse(m);
    j["shards"][2]["count"] = (uint64_t{1} << 40);
    j["count"] = 40 + (uint64_t{1} << 40);
    WriteFile(dir / "manifest.json", j.dump());
    VerifyReport r = Verify(dir);
    INFO(Dump(r));
    CHECK(Names(r, 40 + 20,
                "records 60.." + std::to_string(40 + (uint64_t{1} << 40) - 1) + " missing"));
    CHECK(r.problems.size() <= 3);
    std::unique_ptr<CacheReader> reader;
    CHECK(CacheReader::Open(dir.path(), ReaderOptions(), &reader).IsCorruption());
  }
  SECTION("not JSON") {
    WriteFile(dir / "manifest.json", m.substr(0, m.size() / 2));
    CHECK(!Verify(dir).clean());
  }
  SECTION("missing: an incomplete cache") {
    std::filesystem::remove(dir / "manifest.json");
    VerifyReport r = Verify(dir);
    REQUIRE(r.problems.size() == 1);
    CHECK_THAT(r.problems[0].what, Catch::Contains("incomplete"));
  }
}

TEST_CASE("manifest integers that are not integers in range are Corruption naming the field",
          "[corruption][manifest]") {
  // Regression: these fields were read with nlohmann's get<int>() and
  // get<uint64_t>(): 1e300 was undefined behaviour, -1 wrapped to 2^64 - 1
  // and 1.5 was truncated to 1, all without an error.
  nlohmann::json good =
      nlohmann::json::parse(ReadFile(std::string(KILN_TEST_DATA) + "/manifest_part_auto.json"));
  good.erase("meta_digest");  // so that an edited "preprocessing" fails on its own field
  Manifest m;
  REQUIRE(ManifestFromJson(good.dump(), "m.json", &m).ok());
  struct Field {
    const char* pointer;  // where in the manifest
    const char* name;     // what the message must name
    bool negative_ok;     // -1 is a valid value
  };
  const Field fields[] = {
      {"/format_version", "format_version", true},
      {"/count", "count", false},
      {"/sample/shape/1", "sample.shape[1]", false},
      {"/layout/initial_map_size", "layout.initial_map_size", false},
      {"/layout/commit_records", "layout.commit_records", false},
      {"/part/index", "part.index", true},
      {"/part/of", "part.of", true},
      {"/part/first", "part.first", false},
      {"/shards/0/first", "shards[0].first", false},
      {"/shards/0/count", "shards[0].count", false},
      {"/shards/0/bytes", "shards[0].bytes", false},
      {"/preprocessing/source/files", "source.files", false},
      {"/preprocessing/part/index", "part.index", true},
      {"/preprocessing/part/of", "part.of", true},
      {"/preprocessing/resize", "resize", false},
      {"/preprocessing/crop", "crop", false},
      {"/preprocessing/size/0", "size[0]", false},
      {"/preprocessing/size/1", "size[1]", false},
      {"/preprocessing/channels", "channels", false},
      {"/preprocessing/max_pixels", "max_pixels", false},
      {"/preprocessing/shuffle_seed", "shuffle_seed", true},
      {"/preprocessing/stats_sample", "stats_sample", false},
  };
  for (const Field& f : fields) {
    std::vector<nlohmann::json> bad = {1e300, -1e300, 1.5, "7", nullptr};
    if (!f.negative_ok) bad.push_back(-1);
    for (const nlohmann::json& value : bad) {
      nlohmann::json j = good;
      j[nlohmann::json::json_pointer(f.pointer)] = value;
      const Status s = ManifestFromJson(j.dump(), "m.json", &m);
      INFO(f.pointer << " = " << value.dump() << ": " << s.ToString());
      CHECK(s.IsCorruption());
      CHECK_THAT(s.message(), Catch::Contains("m.json") && Catch::Contains(f.name));
    }
  }
  // The same through Preprocessing::FromJson, as build.json is read.
  Preprocessing p;
  const Status s = Preprocessing::FromJson(R"({"resize": 1e300})", "build.json", &p);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("build.json") && Catch::Contains("resize"));
  CHECK(Preprocessing::FromJson(R"({"stats_sample": -1})", "build.json", &p).IsCorruption());
  CHECK(Preprocessing::FromJson(R"({"channels": 1.5})", "build.json", &p).IsCorruption());
  // Not an integer, but as impossible: a std of 0 (kiln build refuses it)
  // would divide a uint8 cache's pixels by zero in the loader.
  for (const char* std : {R"({"std": [0]})", R"({"std": [0.5, -0.2]})"}) {
    const Status zero = Preprocessing::FromJson(std, "build.json", &p);
    CHECK(zero.IsCorruption());
    CHECK_THAT(zero.message(), Catch::Contains("std"));
  }
  CHECK(Preprocessing::FromJson(R"({"std": [0.25, 1e-9]})", "build.json", &p).ok());
}

TEST_CASE("manifest shapes and shard ranges that overflow are Corruption",
          "[corruption][manifest]") {
  nlohmann::json good =
      nlohmann::json::parse(ReadFile(std::string(KILN_TEST_DATA) + "/manifest_part_auto.json"));
  good.erase("meta_digest");
  good.erase("part");
  good["shards"][0]["first"] = 0;
  Manifest m;
  REQUIRE(ManifestFromJson(good.dump(), "m.json", &m).ok());
  auto read = [&](const nlohmann::json& j) {
    const Status s = ManifestFromJson(j.dump(), "m.json", &m);
    INFO(s.ToString());
    CHECK(s.IsCorruption());
    return s.message();
  };
  SECTION("a shape whose product overflows 64 bits (it wrapped to 0 elements)") {
    nlohmann::json j = good;
    j["sample"]["shape"] = {65536, 65536, 65536, 65536};
    CHECK_THAT(read(j), Catch::Contains("elements"));
  }
  SECTION("a shape over kMaxRecordElements, which no record can have") {
    nlohmann::json j = good;
    j["sample"]["shape"] = {3, 1u << 20, 1u << 20};
    CHECK_THAT(read(j), Catch::Contains("elements"));
    j["sample"]["shape"] = {1, 1u << 20, 1u << 20};  // exactly 2^40: allowed
    CHECK(ManifestFromJson(j.dump(), "m.json", &m).ok());
  }
  SECTION("shard counts whose sum wraps around to \"count\"") {
    nlohmann::json j = good;
    nlohmann::json second = j["shards"][0];
    j["shards"][0]["count"] = UINT64_MAX;
    second["file"] = "shard-00001.mdb";
    second["first"] = UINT64_MAX;
    second["count"] = 16;  // UINT64_MAX + 16 wraps to 15, the manifest's count
    j["shards"].push_back(second);
    CHECK_THAT(read(j), Catch::Contains("2^64"));
  }
  SECTION("a shard file listed twice") {
    nlohmann::json j = good;
    nlohmann::json second = j["shards"][0];
    j["shards"][0]["count"] = 10;
    second["first"] = 10;
    second["count"] = 5;
    j["shards"].push_back(second);
    CHECK_THAT(read(j), Catch::Contains("listed twice"));
  }
  SECTION("a shard file name with a NUL byte (it would open another file)") {
    nlohmann::json j = good;
    j["shards"][0]["file"] = std::string("shard-00000.mdb\0x", 17);
    CHECK_THAT(read(j), Catch::Contains("plain file name"));
  }
  SECTION("shards that are not a list") {
    nlohmann::json j = good;
    j["shards"] = {{"a", j["shards"][0]}};
    CHECK_THAT(read(j), Catch::Contains("shards"));
  }
}

TEST_CASE("JSON nested deeper than kiln writes is Corruption, not a stack overflow",
          "[corruption][manifest]") {
  // Regression (found by tests/fuzz/fuzz_manifest): nlohmann's parser
  // builds any depth without recursion, but dump() recurses, and reading a
  // manifest dumps its "preprocessing": a million nested arrays there
  // overflowed the stack.
  const std::string good = ReadFile(std::string(KILN_TEST_DATA) + "/manifest_part_auto.json");
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string m = good;
  m.insert(m.find("\"preprocessing\": {") + 18, "\"x\": " + deep + ", ");
  Manifest manifest;
  Status s = ManifestFromJson(m, "m.json", &manifest);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("m.json") && Catch::Contains("nested"));
  Preprocessing p;
  s = Preprocessing::FromJson("{\"x\": " + deep + "}", "build.json", &p);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("build.json") && Catch::Contains("nested"));
  // 64 levels are read (a recipe keeps keys it does not know).
  const std::string levels = std::string(63, '[') + std::string(63, ']');
  CHECK(Preprocessing::FromJson("{\"x\": " + levels + "}", "build.json", &p).ok());
}

TEST_CASE("verify reports progress: monotone, per block, ending with a final update", "[verify]") {
  TempDir dir;
  // 40 records of 3x128x128 float32 (192 KiB): about 64 MB per progress block = all of them,
  // so use many shards to see several updates.
  WriteTestCache(dir.path(), 40, DType::kFloat32, MakeShape({3, 128, 128}), 10, 2u << 20);
  std::vector<Progress> seen;
  VerifyOptions o;
  o.level = VerifyLevel::kFull;
  o.progress = [&](const Progress& p) { seen.push_back(p); };
  VerifyReport r;
  REQUIRE(VerifyCache(dir.path(), o, &r).ok());
  REQUIRE(r.clean());
  REQUIRE(seen.size() >= 3);
  for (size_t i = 1; i < seen.size(); ++i) {
    CHECK(seen[i].done >= seen[i - 1].done);
    CHECK(seen[i].bytes >= seen[i - 1].bytes);
  }
  CHECK(seen.back().final);
  CHECK(seen.back().done == 40);
  CHECK(seen.back().total == 40);
  CHECK(seen.back().bytes == r.bytes_checked);
  CHECK_FALSE(seen.front().final);
}

TEST_CASE("verify checks block by block while the cursor reads on: the same findings, progress on the caller's thread",
          "[verify]") {
  TempDir dir;
  MakeCache(dir);
  for (uint64_t i : {7u, 45u}) {
    const std::string shard = dir / (i < 40 ? "shard-00000.mdb" : "shard-00002.mdb");
    FlipByte(shard, PayloadOffset(ReadFile(shard), i) + 10);
  }
  VerifyReport whole = Verify(dir);
  const std::thread::id caller = std::this_thread::get_id();
  bool elsewhere = false;
  size_t updates = 0;
  VerifyOptions o;
  o.threads = 2;
  o.block_bytes = kRecordBytes * 3;  // a block of 3 records: 7 blocks a shard
  o.progress = [&](const Progress&) {
    ++updates;
    if (std::this_thread::get_id() != caller) elsewhere = true;
  };
  VerifyReport blocks;
  REQUIRE(VerifyCache(dir.path(), o, &blocks).ok());
  INFO(Dump(blocks));
  CHECK(Names(blocks, 7, "checksum mismatch"));
  CHECK(Names(blocks, 45, "checksum mismatch"));
  CHECK(blocks.problems.size() == 2);
  CHECK(Dump(blocks) == Dump(whole));
  CHECK(blocks.bytes_checked == whole.bytes_checked);
  CHECK(blocks.records_checked == kCount);
  CHECK_FALSE(elsewhere);
  CHECK(updates >= 3 * 7);
}

TEST_CASE("keyed shards: key_first only in a format 3 manifest, which keeps its record format",
          "[corruption][manifest]") {
  TempDir dir;
  MakeCache(dir);
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  m.shards[1].keyed = true;
  m.shards[1].key_first = 0;  // as kiln merge --from links a cache's first shard
  nlohmann::json j = nlohmann::json::parse(ManifestToJson(m));
  CHECK(j["format_version"] == kFormatVersionKeyed);
  CHECK(j["record_format"] == m.format_version);
  CHECK(j["shards"][1]["key_first"] == 0);
  CHECK_FALSE(j["shards"][0].contains("key_first"));
  Manifest back;
  REQUIRE(ManifestFromJson(j.dump(), "m.json", &back).ok());
  CHECK(back.format_version == m.format_version);
  CHECK(back.shards[1].keyed);
  CHECK(back.shards[1].KeyOf(back.shards[1].first + 3) == 3);
  CHECK(back.shards[1].IndexOf(3) == back.shards[1].first + 3);
  CHECK_FALSE(back.shards[0].keyed);
  // key_first in a manifest of another version is refused: a reader of
  // that version would not use it.
  nlohmann::json two = j;
  two["format_version"] = m.format_version;
  two.erase("meta_digest");
  Manifest refused;
  const Status s = ManifestFromJson(two.dump(), "m.json", &refused);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("key_first"));
  nlohmann::json four = j;
  four["format_version"] = 4;
  CHECK_THAT(ManifestFromJson(four.dump(), "m.json", &refused).message(),
             Catch::Contains("format version 4") && Catch::Contains("use a newer kiln"));
}
