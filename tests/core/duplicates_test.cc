#include "kiln/duplicates.h"

#include <catch2/catch.hpp>
#include <memory>

#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A cache of 1x2x2 uint8 records whose payloads are the given byte values
// (record i: four bytes of pixels[i]) and labels.
void WriteCache(const std::string& dir, const std::vector<uint8_t>& pixels,
                const std::vector<int64_t>& labels) {
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = MakeShape({1, 2, 2});
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir, &w).ok());
  for (size_t i = 0; i < pixels.size(); ++i) {
    const uint8_t p[4] = {pixels[i], pixels[i], pixels[i], pixels[i]};
    REQUIRE(w->Append(i, labels[i], p).ok());
  }
  Manifest m;
  m.classes = {"a", "b", "c"};
  REQUIRE(w->Finish(&m).ok());
}

std::vector<RecordPrint> Prints(const std::string& dir, int threads = 0) {
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir, ReaderOptions(), &r).ok());
  std::vector<RecordPrint> p;
  REQUIRE(FingerprintCache(*r, threads, &p).ok());
  return p;
}

}  // namespace

TEST_CASE("fingerprints are XXH3-128 of the payload: equal pixels, equal prints", "[duplicates]") {
  const uint8_t a[4] = {7, 7, 7, 7}, b[4] = {7, 7, 7, 8};
  CHECK(FingerprintBytes(a, 4) == FingerprintBytes(a, 4));
  CHECK(FingerprintBytes(a, 4) != FingerprintBytes(b, 4));
  TempDir dir;
  WriteCache(dir.path(), {7, 9, 7}, {0, 1, 2});
  const std::vector<RecordPrint> p = Prints(dir.path());
  REQUIRE(p.size() == 3);
  CHECK(p[0].print == FingerprintBytes(a, 4));
  CHECK(p[0].print == p[2].print);
  CHECK(p[0].print != p[1].print);
  CHECK(p[2].label == 2);
  // The thread count changes nothing.
  const std::vector<RecordPrint> one = Prints(dir.path(), 1);
  for (size_t i = 0; i < p.size(); ++i) CHECK(one[i].print == p[i].print);
}

TEST_CASE("FindDuplicates groups equal records within and across caches", "[duplicates]") {
  TempDir train, val, clean;
  // train: 5 and 6 twice each (6 with two labels), 1 once; val: 6 and 2.
  WriteCache(train.path(), {5, 1, 5, 6, 6}, {0, 0, 0, 1, 2});
  WriteCache(val.path(), {2, 6}, {1, 1});
  WriteCache(clean.path(), {1, 2, 3}, {0, 1, 2});
  const std::vector<DuplicateGroup> g = FindDuplicates({Prints(train.path()), Prints(val.path())});
  REQUIRE(g.size() == 2);
  // Ordered by first member: records 0 and 2 of train, then 3, 4 of train and 1 of val.
  REQUIRE(g[0].members.size() == 2);
  CHECK(g[0].members[0].record == 0);
  CHECK(g[0].members[1].record == 2);
  CHECK_FALSE(g[0].labels_differ());
  CHECK_FALSE(g[0].spans(0, 1));
  REQUIRE(g[1].members.size() == 3);
  CHECK(g[1].members[2].cache == 1);
  CHECK(g[1].members[2].record == 1);
  CHECK(g[1].labels_differ());
  CHECK(g[1].spans(0, 1));
  const DuplicateCounts c = CountDuplicates(g, 1, 0);
  CHECK(c.groups == 2);
  CHECK(c.repeats == 3);
  CHECK(c.label_conflicts == 1);
  CHECK(c.overlap == 1);
  CHECK(DuplicateSummary("OUT/duplicates.tsv", c) ==
        "duplicates: 3 records repeat another (2 groups, 1 with different labels), 1 val record "
        "also in train (leakage: validation accuracy is inflated); see OUT/duplicates.tsv");

  // Distinct records: nothing.
  CHECK(FindDuplicates({Prints(clean.path())}).empty());
  CHECK(DuplicateSummary("x", CountDuplicates({})) == "duplicates: none");
  // The clean cache shares 1 with train and 2 with val.
  const DuplicateCounts across = CountDuplicates(
      FindDuplicates({Prints(clean.path()), Prints(train.path())}), 0, 1);
  CHECK(across.overlap == 1);
}

TEST_CASE("a format 2 record's fingerprint covers every field but the label, with its shape",
          "[duplicates]") {
  TempDir dir;
  WriterOptions o;
  FieldSpec pixels, boxes, label;
  pixels.name = "image";
  pixels.dtype = DType::kUint8;
  pixels.ndim = 1;
  pixels.dims[0] = FieldSpec::kVariableDim;
  boxes.name = "boxes";
  boxes.dtype = DType::kFloat32;
  boxes.ndim = 1;
  boxes.dims[0] = FieldSpec::kVariableDim;
  label.name = "label";
  label.dtype = DType::kInt64;
  o.fields = {pixels, boxes, label};
  o.label_field = "label";
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
  // 0 and 1: the same but for their labels; 2: other boxes; 3: the first
  // three of 0's image bytes.
  const uint8_t image[4] = {1, 2, 3, 4};
  const float box[1] = {0.5f};
  struct Rec {
    uint32_t n_image, n_boxes;
    const void* boxes;
    int64_t label;
  };
  const float other[1] = {0.25f};
  const Rec recs[] = {{4, 1, box, 0}, {4, 1, box, 2}, {4, 1, other, 0}, {3, 1, box, 0}};
  for (uint64_t i = 0; i < 4; ++i) {
    const Rec& r = recs[i];
    const FieldData f[3] = {{DType::kUint8, MakeShape({r.n_image}), image},
                            {DType::kFloat32, MakeShape({r.n_boxes}), r.boxes},
                            {DType::kInt64, Shape{}, &r.label}};
    REQUIRE(w->AppendFields(i, f, 3).ok());
  }
  Manifest m;
  m.classes = {"a", "b", "c"};
  REQUIRE(w->Finish(&m).ok());
  const std::vector<RecordPrint> p = Prints(dir.path());
  REQUIRE(p.size() == 4);
  CHECK(p[0].print == p[1].print);
  CHECK(p[1].label == 2);
  CHECK(p[0].print != p[2].print);
  CHECK(p[0].print != p[3].print);
  const std::vector<DuplicateGroup> g = FindDuplicates({p});
  REQUIRE(g.size() == 1);
  CHECK(g[0].labels_differ());
}
