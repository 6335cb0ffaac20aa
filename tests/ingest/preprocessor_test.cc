// The Preprocessor: one file -> one record, the same bytes as decoding,
// resizing and normalizing by hand; the record shape; exact statistics.
#include "preprocessor.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "core/file.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::ingest;
using namespace kiln::testing;

namespace {
SourceList Photos() {
  SourceList src;
  src.root = std::string(KILN_SAMPLE_DATA) + "/photos";
  for (const char* n : {"chelsea.jpg", "coffee.jpg", "rocket.jpg"})
    src.items.push_back({n, 0, 0, 0});
  return src;
}
}  // namespace

TEST_CASE("Process gives the bytes of decode, resize, crop and normalize", "[preprocessor]") {
  Preprocessing r;
  r.complete = true;
  r.resize = 40;
  r.crop = 32;
  r.channels = 3;
  r.dtype = DType::kFloat32;
  r.mean = {0.5, 0.4, 0.3};
  r.std = {0.2, 0.25, 0.3};
  const SourceList src = Photos();
  Shape shape;
  REQUIRE(Preprocessor::PlanShape(r, src, &shape).ok());
  CHECK(shape.ToString() == "3x32x32");
  const Preprocessor pre(r, shape);
  CHECK(pre.record_bytes() == 3 * 32 * 32 * 4);
  Preprocessor::Scratch scratch;
  std::vector<uint8_t> got(pre.record_bytes()), want(pre.record_bytes());
  REQUIRE(pre.Process(src.root, src.items[0], &scratch, got.data()).ok());

  std::vector<uint8_t> bytes;
  REQUIRE(ReadFileBytes(src.root + "/chelsea.jpg", &bytes).ok());
  image::ResizeSpec spec;
  spec.resize_shorter = 40;
  spec.crop = 32;
  image::DecodeOptions d;
  d.channels = 3;
  // The smallest decode the resize allows (TurboJPEG's DCT scaling), as a build does.
  REQUIRE(image::PlanResize(451, 300, spec, &d.min_width, &d.min_height).ok());
  image::ImageU8 full, resized;
  REQUIRE(image::Decode(bytes.data(), bytes.size(), "chelsea.jpg", d, &full).ok());
  REQUIRE(image::ResizeAndCrop(full, spec, &resized).ok());
  const float mean[] = {0.5f, 0.4f, 0.3f}, stdv[] = {0.2f, 0.25f, 0.3f};
  REQUIRE(image::ToCHW(resized, DType::kFloat32, mean, stdv, want.data()).ok());
  CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
}

TEST_CASE("the record shape: crop, size, or the first readable image", "[preprocessor]") {
  SourceList src = Photos();
  src.items.insert(src.items.begin(), SourceItem{"missing.jpg", 0, 0, 0});
  Preprocessing r;
  r.channels = 1;
  Shape shape;
  r.size_w = 40;
  r.size_h = 30;
  REQUIRE(Preprocessor::PlanShape(r, src, &shape).ok());
  CHECK(shape.ToString() == "1x30x40");
  r.size_w = r.size_h = 0;
  REQUIRE(Preprocessor::PlanShape(r, src, &shape).ok());  // chelsea.jpg: 451x300
  CHECK(shape.ToString() == "1x300x451");
  src.items.resize(1);
  CHECK(Preprocessor::PlanShape(r, src, &shape).IsInvalidArgument());
}

TEST_CASE("statistics are exact and the same for any thread count", "[preprocessor]") {
  Preprocessing r;
  r.resize = 24;
  r.crop = 24;
  r.channels = 3;
  const SourceList src = Photos();
  Shape shape;
  REQUIRE(Preprocessor::PlanShape(r, src, &shape).ok());
  const Preprocessor pre(r, shape);
  std::vector<double> m1, s1, m2, s2;
  REQUIRE(pre.MeasureStats(src, {0, 1, 2}, 1, &m1, &s1).ok());
  REQUIRE(pre.MeasureStats(src, {0, 1, 2}, 2, &m2, &s2).ok());
  CHECK(m1 == m2);
  CHECK(s1 == s2);
  REQUIRE(m1.size() == 3);
  for (double v : m1) CHECK((v > 0 && v < 1));
  CHECK(pre.MeasureStats(src, {}, 1, &m1, &s1).IsInvalidArgument());
}

TEST_CASE("a re-check needs a recipe kiln build wrote", "[preprocessor]") {
  Preprocessor pre;
  Shape shape = MakeShape({3, 8, 8});
  CHECK(Preprocessor::FromManifestRecipe(Preprocessing(), shape, &pre).IsCorruption());
  Preprocessing r;
  r.complete = true;
  r.source.root = "/data";
  r.mean = {0, 0, 0};
  r.std = {1, 1, 1};
  REQUIRE(Preprocessor::FromManifestRecipe(r, shape, &pre).ok());
  CHECK(pre.record_bytes() == 3 * 8 * 8 * 2);
}
