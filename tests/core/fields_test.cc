// Format 2: records of named fields, each with its own dtype and shape.
// The record encoding (kiln/record.h), the writer, the reader (mapped and
// pread paths), verify, and the loader on such caches.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/loader.h"
#include "kiln/manifest.h"
#include "kiln/record.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::MakeShape;
using kiln::testing::MakeFieldSpec;
using kiln::testing::TempDir;

namespace {

constexpr int64_t V = FieldSpec::kVariableDim;

// Deterministic bytes for field f of record i.
std::vector<uint8_t> Bytes(uint64_t i, int f, size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t k = 0; k < n; ++k) b[k] = static_cast<uint8_t>(i * 31 + f * 7 + k * 13);
  return b;
}

// A record of the test schema below: image uint8 3 x H x W (H, W vary with
// i), mask uint8 H x W, boxes float32 N x 4 (N = i % 3, so 0 happens),
// label int64 scalar, score float16 fixed (2), tokens int32 (varies).
struct Sample {
  std::vector<Shape> shapes;
  std::vector<std::vector<uint8_t>> data;
  std::vector<FieldData> fields;
};
std::vector<FieldSpec> Schema() {
  return {MakeFieldSpec("image", DType::kUint8, {3, V, V}),
          MakeFieldSpec("mask", DType::kUint8, {V, V}),
          MakeFieldSpec("boxes", DType::kFloat32, {V, 4}),
          MakeFieldSpec("label", DType::kInt64, {}),
          MakeFieldSpec("score", DType::kFloat16, {2}),
          MakeFieldSpec("tokens", DType::kInt32, {V})};
}
Sample MakeSample(uint64_t i) {
  Sample s;
  const uint32_t h = 5 + i % 4, w = 7 + i % 3;
  s.shapes = {MakeShape({3, h, w}),
              MakeShape({h, w}),
              MakeShape({static_cast<uint32_t>(i % 3), 4}),
              Shape{},
              MakeShape({2}),
              MakeShape({static_cast<uint32_t>(1 + i % 5)})};
  s.shapes[2].ndim = 2;  // MakeShape of a 0 dim
  s.shapes[2].dims = {static_cast<uint32_t>(i % 3), 4, 0, 0};
  const DType types[] = {DType::kUint8, DType::kUint8,   DType::kFloat32,
                         DType::kInt64, DType::kFloat16, DType::kInt32};
  for (int f = 0; f < 6; ++f) {
    const size_t n = FieldElements(s.shapes[f]) * DTypeSize(types[f]);
    s.data.push_back(Bytes(i, f, n));
  }
  // Floats must be finite: float32 boxes of small integers, float16 1.0.
  for (size_t k = 0; k + 4 <= s.data[2].size(); k += 4) {
    const float v = static_cast<float>(k + i);
    std::memcpy(s.data[2].data() + k, &v, 4);
  }
  for (size_t k = 0; k + 2 <= s.data[4].size(); k += 2) {
    s.data[4][k] = 0x00;
    s.data[4][k + 1] = 0x3C;
  }
  const int64_t label = static_cast<int64_t>(i % 3);
  std::memcpy(s.data[3].data(), &label, 8);
  for (int f = 0; f < 6; ++f) s.fields.push_back({types[f], s.shapes[f], s.data[f].data()});
  return s;
}

WriterOptions SchemaOptions(uint64_t shard_size) {
  WriterOptions o;
  o.fields = Schema();
  o.label_field = "label";
  o.shard_size = shard_size;
  o.initial_map_size = 1 << 20;
  o.commit_bytes = 2000;
  return o;
}

void WriteSchemaCache(const std::string& dir, uint64_t n, uint64_t shard_size = 4ull << 30) {
  const WriterOptions o = SchemaOptions(shard_size);
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir, &w).ok());
  for (uint64_t i = 0; i < n; ++i) {
    Sample s = MakeSample(i);
    REQUIRE(w->AppendFields(i, s.fields.data(), 6).ok());
  }
  Manifest meta;
  meta.classes = {"a", "b", "c"};
  REQUIRE(w->Finish(&meta).ok());
}

void CheckRecord(const RecordView& v, uint64_t i) {
  Sample s = MakeSample(i);
  REQUIRE(v.num_fields == 6);
  for (int f = 0; f < 6; ++f) {
    INFO("record " << i << " field " << f);
    CHECK(v.fields[f].shape == s.shapes[f]);
    CHECK(v.fields[f].dtype == s.fields[f].dtype);
    REQUIRE(v.fields[f].bytes == s.data[f].size());
    CHECK(std::memcmp(v.fields[f].data, s.data[f].data(), s.data[f].size()) == 0);
  }
  CHECK(v.label == static_cast<int64_t>(i % 3));
  CHECK(v.data == v.fields[0].data);
  CHECK(v.shape == s.shapes[0]);
}

}  // namespace

TEST_CASE("a version 2 record round-trips every dtype, fixed, variable, empty and scalar fields",
          "[fields]") {
  for (uint64_t i = 0; i < 12; ++i) {
    Sample s = MakeSample(i);
    std::vector<uint8_t> value(RecordV2Size(s.fields.data(), 6), 0xEE);
    EncodeRecordV2(i, s.fields.data(), 6, value.data());
    RecordHeader h;
    REQUIRE(DecodeRecordHeader(i, value.data(), value.size(), &h).ok());
    CHECK(h.version == kRecordVersion2);
    REQUIRE(h.num_fields == 6);
    CHECK(h.value_bytes == value.size());
    for (int f = 0; f < 6; ++f) {
      CHECK(h.fields[f].offset % kFieldAlign == 0);
      CHECK(h.fields[f].shape == s.shapes[f]);
      CHECK(std::memcmp(value.data() + h.fields[f].offset, s.data[f].data(), s.data[f].size()) ==
            0);
    }
    CHECK(VerifyRecordChecksum(i, value.data(), h).ok());
    CHECK(VerifyRecordChecksum(i + 1, value.data(), h).IsCorruption());  // bound to the index
    // Padding is zero: the bytes are canonical whatever the buffer held.
    std::vector<uint8_t> again(value.size(), 0x11);
    EncodeRecordV2(i, s.fields.data(), 6, again.data());
    CHECK(again == value);
    CHECK(StoredChecksumOffset(value.data(), value.size()) == kChecksumOffsetV2);
  }
}

TEST_CASE("a flipped byte anywhere in a version 2 record fails its checksum or its decoding",
          "[fields]") {
  Sample s = MakeSample(4);
  std::vector<uint8_t> value(RecordV2Size(s.fields.data(), 6));
  EncodeRecordV2(4, s.fields.data(), 6, value.data());
  for (size_t at = 0; at < value.size(); ++at) {
    if (at >= kChecksumOffsetV2 && at < kChecksumOffsetV2 + 8) continue;  // the checksum itself
    std::vector<uint8_t> bad = value;
    bad[at] ^= 0x40;
    RecordHeader h;
    const Status st = DecodeRecordHeader(4, bad.data(), bad.size(), &h);
    INFO("byte " << at);
    if (st.ok()) {
      CHECK(VerifyRecordChecksum(4, bad.data(), h).IsCorruption());
    } else {
      CHECK(st.IsCorruption());
    }
  }
}

TEST_CASE("a version 2 field table that overruns its value is Corruption, never a read past it",
          "[fields]") {
  Sample s = MakeSample(7);
  std::vector<uint8_t> value(RecordV2Size(s.fields.data(), 6));
  EncodeRecordV2(7, s.fields.data(), 6, value.data());
  RecordHeader h;
  SECTION("a shape larger than the value") {
    value[kRecordV2HeaderSize + 8] = 0xFF;  // image's first dim
    CHECK_THAT(DecodeRecordHeader(7, value.data(), value.size(), &h).message(),
               Catch::Contains("field 0") && Catch::Contains("offset"));
  }
  SECTION("an offset moved") {
    value[kRecordV2HeaderSize + kFieldEntrySize * 2 + 24] += 16;
    CHECK_THAT(DecodeRecordHeader(7, value.data(), value.size(), &h).message(),
               Catch::Contains("field 2: payload offset"));
  }
  SECTION("a field count past the value") {
    value[6] = 16;
    CHECK(DecodeRecordHeader(7, value.data(), 200, &h).IsCorruption());
  }
  SECTION("every truncation") {
    for (size_t n = 0; n < value.size(); ++n)
      CHECK(DecodeRecordHeader(7, value.data(), n, &h).IsCorruption());
  }
  SECTION("random damage to the header and table") {
    std::mt19937 rng(5);
    for (int t = 0; t < 20000; ++t) {
      std::vector<uint8_t> bad = value;
      for (int k = 0; k < 3; ++k) bad[rng() % RecordV2TableEnd(6)] = static_cast<uint8_t>(rng());
      const size_t n = rng() % 2 ? bad.size() : rng() % bad.size();
      if (DecodeRecordHeader(7, bad.data(), n, &h).ok()) {
        REQUIRE(h.value_bytes == n);
        for (int f = 0; f < h.num_fields; ++f) REQUIRE(h.fields[f].offset + h.fields[f].bytes <= n);
      }
    }
  }
}

TEST_CASE("a format 2 cache reads back every field by Get and by Read, and verifies clean",
          "[fields]") {
  TempDir dir;
  const uint64_t n = 40;
  WriteSchemaCache(dir.path(), n, /*shard_size=*/6000);
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  CHECK(m.format_version == kFormatVersion2);
  REQUIRE(m.fields.size() == 6);
  CHECK(m.shards.size() > 1);
  CHECK(m.label_field == 3);
  CHECK(m.image_field == 0);
  CHECK(m.fields[0].ShapeText() == "3x?x?");
  // The largest sizes seen: H = 5 + 3, W = 7 + 2, 2 boxes, 5 tokens.
  CHECK(m.fields[0].max_dims[1] == 8);
  CHECK(m.fields[0].max_dims[2] == 9);
  CHECK(m.fields[2].max_dims[0] == 2);
  CHECK(m.fields[5].max_dims[0] == 5);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  CHECK(r->read_header_bytes() == 0);  // sizes vary: Read maps
  auto txn = r->BeginRead();
  for (uint64_t i = 0; i < n; ++i) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, true).ok());
    CheckRecord(v, i);
    RecordView w;
    REQUIRE(txn->Read(i, nullptr, nullptr, &w, true).ok());
    CheckRecord(w, i);
  }
  VerifyReport rep;
  REQUIRE(VerifyCache(dir.path(), VerifyOptions(), &rep).ok());
  CHECK(rep.clean());
  CHECK(rep.records_checked == n);
}

TEST_CASE(
    "a format 2 cache of fixed fields is read with pread into the slot, and the loader "
    "batches its image and label",
    "[fields]") {
  TempDir dir;
  const uint64_t n = 24;
  WriterOptions o;
  o.fields = {MakeFieldSpec("label", DType::kInt32, {}),
              MakeFieldSpec("image", DType::kFloat16, {1, 4, 6}),
              MakeFieldSpec("extra", DType::kUint8, {3})};
  o.label_field = "label";
  o.initial_map_size = 1 << 20;
  {
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
    for (uint64_t i = 0; i < n; ++i) {
      const int32_t label = static_cast<int32_t>(i % 5);
      std::vector<uint8_t> image = Bytes(i, 1, 48);
      for (size_t k = 1; k < 48; k += 2) image[k] &= 0x3B;  // finite halves
      std::vector<uint8_t> extra = Bytes(i, 2, 3);
      FieldData f[3] = {{DType::kInt32, Shape{}, &label},
                        {DType::kFloat16, MakeShape({1, 4, 6}), image.data()},
                        {DType::kUint8, MakeShape({3}), extra.data()}};
      REQUIRE(w->AppendFields(i, f, 3).ok());
    }
    Manifest meta;
    REQUIRE(w->Finish(&meta).ok());
  }
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  CHECK(r->manifest().image_field == 1);
  CHECK(r->manifest().shape == MakeShape({1, 4, 6}));
  CHECK(r->record_bytes() == 48);
  REQUIRE(r->read_header_bytes() > 0);
  auto txn = r->BeginRead();
  std::vector<uint8_t> header(r->read_header_bytes()), payload(48);
  for (uint64_t i = 0; i < n; ++i) {
    RecordView v;
    REQUIRE(txn->Read(i, header.data(), payload.data(), &v, true).ok());
    CHECK(v.data == payload.data());  // straight into the slot
    CHECK(v.label == static_cast<int64_t>(i % 5));
    std::vector<uint8_t> image = Bytes(i, 1, 48);
    for (size_t k = 1; k < 48; k += 2) image[k] &= 0x3B;
    CHECK(std::memcmp(payload.data(), image.data(), 48) == 0);
    CHECK(std::memcmp(v.fields[2].data, Bytes(i, 2, 3).data(), 3) == 0);
  }
  // The loader: the image field batched, the int32 label widened.
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.workers = 2;
  lo.shuffle = false;
  std::vector<std::vector<uint8_t>> data(2, std::vector<uint8_t>(8 * 48));
  std::vector<std::vector<int64_t>> labels(2, std::vector<int64_t>(8));
  std::vector<BatchSlot> slots;
  for (int s = 0; s < 2; ++s) slots.push_back({data[s].data(), labels[s].data()});
  std::unique_ptr<Loader> loader;
  REQUIRE(Loader::Open(r.get(), lo, slots, &loader).ok());
  REQUIRE(loader->StartEpoch(0).ok());
  Batch b;
  REQUIRE(loader->Next(&b).ok());
  REQUIRE(b.size == 8);
  for (uint64_t j = 0; j < 8; ++j) CHECK(labels[b.slot][j] == static_cast<int64_t>(j % 5));
  std::vector<uint8_t> first = Bytes(0, 1, 48);
  for (size_t k = 1; k < 48; k += 2) first[k] &= 0x3B;
  CHECK(std::memcmp(data[b.slot].data(), first.data(), 48) == 0);
}

TEST_CASE(
    "a sample that does not fit the declared fields is refused naming record and field, "
    "and nothing is written",
    "[fields]") {
  TempDir dir;
  WriterOptions o;
  o.fields = Schema();
  o.label_field = "label";
  o.initial_map_size = 1 << 20;
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
  Sample s = MakeSample(0);
  SECTION("a wrong dtype") {
    s.fields[2].dtype = DType::kFloat16;
    CHECK_THAT(w->AppendFields(0, s.fields.data(), 6).message(),
               Catch::Contains("record 0, field 'boxes'") && Catch::Contains("float32 ?x4"));
  }
  SECTION("a wrong fixed dim") {
    s.fields[0].shape.dims[0] = 4;
    CHECK_THAT(w->AppendFields(0, s.fields.data(), 6).message(),
               Catch::Contains("record 0, field 'image'"));
  }
  SECTION("a missing field") {
    CHECK_THAT(w->AppendFields(0, s.fields.data(), 5).message(),
               Catch::Contains("5 fields, the cache declares 6"));
  }
  CHECK(w->next_index() == 0);
  REQUIRE(w->AppendFields(0, MakeSample(0).fields.data(), 6).ok());
  CHECK(w->next_index() == 1);
}

TEST_CASE(
    "a label outside the classes and a damaged field table fail kiln verify naming the "
    "record",
    "[fields]") {
  TempDir dir;
  WriteSchemaCache(dir.path(), 10);
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  const std::string shard = dir / m.shards[0].file;
  const std::string bytes = kiln::testing::ReadFile(shard);
  // Record 6's value: find its encoding in the file.
  Sample s = MakeSample(6);
  std::vector<uint8_t> value(RecordV2Size(s.fields.data(), 6));
  EncodeRecordV2(6, s.fields.data(), 6, value.data());
  const size_t at = bytes.find(std::string(value.begin(), value.end()));
  REQUIRE(at != std::string::npos);
  SECTION("a payload byte of the mask") {
    RecordHeader h;
    REQUIRE(DecodeRecordHeader(6, value.data(), value.size(), &h).ok());
    kiln::testing::FlipByte(shard, at + h.fields[1].offset + 3);
  }
  SECTION("a byte of the field table") {
    kiln::testing::FlipByte(shard, at + kRecordV2HeaderSize + kFieldEntrySize * 4 + 8);
  }
  for (VerifyLevel level : {VerifyLevel::kFull}) {
    VerifyOptions vo;
    vo.level = level;
    VerifyReport rep;
    REQUIRE(VerifyCache(dir.path(), vo, &rep).ok());
    REQUIRE_FALSE(rep.clean());
    bool named = false;
    for (const VerifyProblem& p : rep.problems) named = named || p.index == 6;
    CHECK(named);
  }
}

TEST_CASE("a format 2 writer resumes after its committed records and ends with the same bytes",
          "[fields]") {
  TempDir a, b;
  WriteSchemaCache(a.path(), 30, 8000);
  {
    const WriterOptions o = SchemaOptions(8000);
    std::unique_ptr<CacheWriter> w;
    REQUIRE(CacheWriter::Open(o, b.path(), &w).ok());
    for (uint64_t i = 0; i < 17; ++i) {
      Sample s = MakeSample(i);
      REQUIRE(w->AppendFields(i, s.fields.data(), 6).ok());
    }
    REQUIRE(w->Commit().ok());
    // Dropped without Finish: as if killed after the commit.
  }
  WriterOptions o = SchemaOptions(8000);
  o.resume = true;
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, b.path(), &w).ok());
  REQUIRE(w->next_index() == 17);
  for (uint64_t i = 17; i < 30; ++i) {
    Sample s = MakeSample(i);
    REQUIRE(w->AppendFields(i, s.fields.data(), 6).ok());
  }
  Manifest meta;
  meta.classes = {"a", "b", "c"};
  REQUIRE(w->Finish(&meta).ok());
  Manifest ma, mb;
  REQUIRE(ReadManifest(a.path(), &ma).ok());
  REQUIRE(ReadManifest(b.path(), &mb).ok());
  REQUIRE(ma.shards.size() == mb.shards.size());
  for (size_t i = 0; i < ma.shards.size(); ++i) {
    CHECK(ma.shards[i].digest == mb.shards[i].digest);
    CHECK(kiln::testing::ReadFile(a / ma.shards[i].file) ==
          kiln::testing::ReadFile(b / mb.shards[i].file));
  }
  CHECK(ma.fields[0].max_dims == mb.fields[0].max_dims);
}

TEST_CASE("a format 2 manifest round-trips its fields, and a bad declaration is refused",
          "[fields]") {
  TempDir dir;
  WriteSchemaCache(dir.path(), 3);
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  Manifest again;
  REQUIRE(ManifestFromJson(ManifestToJson(m), "x", &again).ok());
  CHECK(ManifestToJson(again) == ManifestToJson(m));
  int image = 0, label = 0;
  CHECK_THAT(CheckFieldSpecs(
                 {MakeFieldSpec("a", DType::kUint8, {2}), MakeFieldSpec("a", DType::kUint8, {2})},
                 "", "w", &image, &label)
                 .message(),
             Catch::Contains("'a' is empty or given twice"));
  CHECK_THAT(
      CheckFieldSpecs({MakeFieldSpec("label", DType::kFloat32, {})}, "label", "w", &image, &label)
          .message(),
      Catch::Contains("must be an int64 or int32 scalar"));
  CHECK_THAT(
      CheckFieldSpecs({MakeFieldSpec("x", DType::kUint8, {2})}, "y", "w", &image, &label).message(),
      Catch::Contains("'y' is not one of the fields"));
  // A format 1 manifest reads as the fields image and label.
  TempDir v1;
  kiln::testing::WriteTestCache(v1.path(), 4, DType::kUint8, MakeShape({3, 2, 2}));
  Manifest m1;
  REQUIRE(ReadManifest(v1.path(), &m1).ok());
  REQUIRE(m1.fields.size() == 2);
  CHECK(m1.fields[0].name == "image");
  CHECK(m1.fields[0].ShapeText() == "3x2x2");
  CHECK(m1.fields[1].name == "label");
  CHECK(m1.label_field == 1);
}

TEST_CASE("the loader refuses an image field whose size varies, saying what it needs", "[fields]") {
  TempDir dir;
  WriteSchemaCache(dir.path(), 4);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir.path(), ReaderOptions(), &r).ok());
  LoaderOptions lo;
  lo.batch_size = 2;
  std::vector<uint8_t> data(1024);
  std::vector<int64_t> labels(2);
  std::unique_ptr<Loader> loader;
  const Status st = Loader::Open(r.get(), lo, {{data.data(), labels.data()}}, &loader);
  CHECK_THAT(st.message(),
             Catch::Contains("'image' field varies in size") && Catch::Contains("output geometry"));
}
