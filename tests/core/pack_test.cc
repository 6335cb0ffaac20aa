// Packs of records in one LMDB value (kiln/record.h, format.md "Packs"):
// the layout and its checks, and a cache of packed records through the
// writer (with a resume), the reader, verify and RewriteRecords.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/manifest.h"
#include "kiln/record.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> Filled(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 7 + i * 13);
  return v;
}

// Record i of the test cache: a label and a 1 x H x W uint8 image whose
// size varies (a few hundred bytes to a few KB).
struct Sample {
  int64_t label;
  uint32_t h, w;
  std::vector<uint8_t> pixels;
};
Sample SampleOf(uint64_t i) {
  Sample s;
  s.label = static_cast<int64_t>(i % 3);
  s.h = 8 + static_cast<uint32_t>((i * 37) % 41);
  s.w = 16 + static_cast<uint32_t>((i * 11) % 29);
  s.pixels = Filled(static_cast<size_t>(s.h) * s.w, static_cast<uint8_t>(i));
  return s;
}

WriterOptions PackedOptions() {
  WriterOptions o;
  constexpr int64_t V = FieldSpec::kVariableDim;
  o.fields = {MakeFieldSpec("image", DType::kUint8, {1, V, V}),
              MakeFieldSpec("label", DType::kInt64, {})};
  o.label_field = "label";
  o.pack_bytes = 3000;     // several records a pack
  o.commit_bytes = 10000;  // several packs a commit
  o.shard_size = 30000;    // several shards
  o.initial_map_size = 1 << 20;
  return o;
}

void Write(CacheWriter* w, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; ++i) {
    const Sample s = SampleOf(i);
    FieldData f[2] = {{DType::kUint8, MakeShape({1, s.h, s.w}), s.pixels.data()},
                      {DType::kInt64, Shape{}, &s.label}};
    REQUIRE(w->AppendFields(i, f, 2).ok());
  }
}

std::map<std::string, std::string> Shards(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (IsShardFile(e.path().filename().string()))
      out[e.path().filename().string()] = ReadFile(e.path().string());
  return out;
}

std::string VerifyText(const std::string& dir) {
  VerifyReport rep;
  const Status s = VerifyCache(dir, VerifyOptions(), &rep);
  if (!s.ok()) return s.ToString();
  std::string all;
  for (const auto& p : rep.problems) all += p.what + "\n";
  return all;
}

constexpr uint64_t kCount = 60;

}  // namespace

TEST_CASE("a pack holds its records at 16-byte offsets, and a damaged table is named",
          "[pack][record]") {
  const auto a = Filled(5, 1), b = Filled(33, 2), c = Filled(100, 3);
  const uint8_t* parts[3] = {a.data(), b.data(), c.data()};
  const size_t sizes[3] = {a.size(), b.size(), c.size()};
  std::vector<uint8_t> pack;
  EncodePack(parts, sizes, 3, &pack);
  REQUIRE(IsPack(pack.data(), pack.size()));
  CHECK(PackCount(pack.data()) == 3);
  for (uint32_t j = 0; j < 3; ++j) {
    const uint8_t* rec = nullptr;
    size_t len = 0;
    REQUIRE(PackEntry(pack.data(), pack.size(), 100, j, &rec, &len).ok());
    CHECK((rec - pack.data()) % 16 == 0);
    CHECK(std::vector<uint8_t>(rec, rec + len) ==
          std::vector<uint8_t>(parts[j], parts[j] + sizes[j]));
  }
  const uint8_t* rec = nullptr;
  size_t len = 0;
  CHECK(PackEntry(pack.data(), pack.size(), 100, 3, &rec, &len).IsNotFound());
  // A record's own value is not a pack.
  CHECK_FALSE(IsPack(a.data(), a.size()));
  auto damaged = [&](size_t at, uint64_t v, size_t width) {
    std::vector<uint8_t> bad = pack;
    std::memcpy(bad.data() + at, &v, width);
    Status worst = Status::OK();
    for (uint32_t j = 0; j < 3 && worst.ok(); ++j)
      worst = PackEntry(bad.data(), bad.size(), 100, j, &rec, &len);
    return worst;
  };
  for (const auto& [at, v, width] : std::vector<std::tuple<size_t, uint64_t, size_t>>{
           {4, 0, 4},          // no records
           {4, 1u << 30, 4},   // more than fit
           {16, 8, 8},         // the first record inside the table
           {16, 80, 8},        // the first after a gap
           {32, 65, 8},        // the second misaligned
           {24, 1u << 20, 8},  // the first's length past the end
           {56, 99, 8}}) {     // the last not ending the value
    INFO("byte " << at);
    const Status s = damaged(at, v, width);
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("the pack of records under key 100 is damaged"));
  }
}

TEST_CASE(
    "a cache of packed records reads, verifies, resumes and is rewritten as one written whole",
    "[pack][cache]") {
  TempDir whole, resumed;
  {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(PackedOptions(), whole.path(), &w).ok());
    Write(w.get(), 0, kCount);
    Manifest meta;
    meta.classes = {"a", "b", "c"};
    REQUIRE(w->Finish(&meta).ok());
  }
  Manifest m;
  REQUIRE(ReadManifest(whole.path(), &m).ok());
  CHECK(m.pack_bytes == 3000);
  REQUIRE(m.shards.size() > 1);
  for (const ShardInfo& s : m.shards) {
    INFO(s.file);
    CHECK(s.packed());
    CHECK(s.values < s.count);
  }
  const auto j = nlohmann::json::parse(ReadFile(whole / kManifestName));
  CHECK(j["format_version"] == kFormatVersionKeyed);
  CHECK(j["record_format"] == kFormatVersion2);
  CHECK(j["layout"]["pack_bytes"] == 3000);

  // Every record, in a shuffled order and across snapshots, is the one written.
  {
    std::unique_ptr<CacheReader> r;
    REQUIRE(CacheReader::Open(whole.path(), ReaderOptions(), &r).ok());
    auto txn = r->BeginRead();
    std::vector<uint64_t> order(kCount);
    for (uint64_t i = 0; i < kCount; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    for (size_t k = 0; k < order.size(); ++k) {
      const uint64_t i = order[k];
      INFO("record " << i);
      RecordView v;
      REQUIRE(txn->Get(i, &v, /*verify_checksum=*/true).ok());
      const Sample s = SampleOf(i);
      CHECK(v.label == s.label);
      CHECK(v.shape == MakeShape({1, s.h, s.w}));
      CHECK(std::memcmp(v.data, s.pixels.data(), s.pixels.size()) == 0);
      if (k % 5 == 4) txn->Reset();  // the shard's cursor follows the new snapshot
    }
    RecordView past;
    CHECK(txn->Get(kCount, &past).IsNotFound());
  }
  CHECK(VerifyText(whole.path()) == "");

  // Written in two runs, the first dropped after an explicit commit: the
  // same bytes (the resumed shard is rewritten from its packs).
  {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(PackedOptions(), resumed.path(), &w).ok());
    Write(w.get(), 0, 37);
    REQUIRE(w->Commit().ok());
  }
  {
    WriterOptions o = PackedOptions();
    o.resume = true;
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, resumed.path(), &w).ok());
    REQUIRE(w->next_index() == 37);
    Write(w.get(), 37, kCount);
    Manifest meta;
    meta.classes = {"a", "b", "c"};
    REQUIRE(w->Finish(&meta).ok());
  }
  CHECK(Shards(resumed.path()) == Shards(whole.path()));
  Manifest again;
  REQUIRE(ReadManifest(resumed.path(), &again).ok());
  for (size_t s = 0; s < m.shards.size(); ++s) CHECK(again.shards[s].values == m.shards[s].values);

  // A record rewritten in place (as --repair does) with its own content:
  // the shard comes out as it was.
  {
    const Sample s = SampleOf(9);
    RecordFix fix;
    fix.index = 9;
    fix.fields = {{DType::kUint8, MakeShape({1, s.h, s.w}), s.pixels.data()},
                  {DType::kInt64, Shape{}, &s.label}};
    REQUIRE(RewriteRecords(resumed.path(), {fix}).ok());
    CHECK(Shards(resumed.path()) == Shards(whole.path()));
  }

  // A damaged pack table (the first pack's count): verify names it, the
  // reader refuses the records, nothing reads past the value.
  const std::string shard0 = (resumed / m.shards[0].file);
  const std::string bytes = ReadFile(shard0);
  const size_t magic = bytes.find("KLNP");
  REQUIRE(magic != std::string::npos);
  FlipByte(shard0, magic + 5);  // the count's second byte: 256 more records
  CHECK_THAT(VerifyText(resumed.path()),
             Catch::Contains("a pack of records whose table is damaged"));
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(resumed.path(), ReaderOptions(), &r).ok());
  RecordView v;
  const Status got = r->BeginRead()->Get(1, &v);
  CHECK(got.IsCorruption());
  CHECK_THAT(got.message(), Catch::Contains("record 1") && Catch::Contains("is damaged"));

  // A manifest whose value count disagrees with the shard's is refused.
  TempDir edited;
  for (const auto& [name, content] : Shards(whole.path())) WriteFile(edited / name, content);
  std::string text = ReadFile(whole / kManifestName);
  const std::string values = "\"values\": " + std::to_string(m.shards[0].values);
  REQUIRE(text.find(values) != std::string::npos);
  text.replace(text.find(values), values.size(),
               "\"values\": " + std::to_string(m.shards[0].values + 1));
  WriteFile(edited / kManifestName, text);
  const Status open = CacheReader::Open(edited.path(), ReaderOptions(), &r);
  CHECK(open.IsCorruption());
  CHECK_THAT(open.message(), Catch::Contains("values (packs of records)"));
}
