// The typed recipe: manifests written by kiln before it existed read back
// and write out byte for byte; partial recipes of other writers are kept.
#include "kiln/preprocessing.h"

#include <catch2/catch.hpp>

#include "kiln/manifest.h"
#include "kiln/shuffle.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("manifests of earlier kilns read back and write out identical", "[manifest]") {
  for (const char* name : {"manifest_list_uint8.json", "manifest_part_auto.json"}) {
    const std::string text = ReadFile(std::string(KILN_TEST_DATA) + "/" + name);
    Manifest m;
    REQUIRE(ManifestFromJson(text, name, &m).ok());
    CHECK(m.preprocessing.complete);
    CHECK(ManifestToJson(m) == text);
  }
  Manifest m;
  REQUIRE(ManifestFromJson(ReadFile(std::string(KILN_TEST_DATA) + "/manifest_part_auto.json"),
                           "part", &m)
              .ok());
  const Preprocessing& p = m.preprocessing;
  CHECK(p.norm == NormKind::kAuto);
  CHECK(p.part_index == 1);
  CHECK(p.part_count == 2);
  CHECK(p.channels == 1);
  CHECK(p.dtype == DType::kFloat16);
  CHECK(p.stats_sample == 20);
  CHECK(p.split == "val");
  CHECK(p.source.layout == "imagefolder");
  CHECK(p.mean.size() == 1);
}

TEST_CASE("a partial recipe keeps its bytes, and a complete one its unknown keys", "[manifest]") {
  Preprocessing p;
  REQUIRE(Preprocessing::FromJson(R"({"std": [0.5], "mean": [0.25], "x": 1})", "t", &p).ok());
  CHECK_FALSE(p.complete);
  CHECK(p.mean == std::vector<double>{0.25});
  CHECK(p.ToJson() == R"({"mean":[0.25],"std":[0.5],"x":1})");
  CHECK(Preprocessing().ToJson() == "{}");

  Manifest m;
  REQUIRE(
      ManifestFromJson(ReadFile(std::string(KILN_TEST_DATA) + "/manifest_list_uint8.json"), "m", &m)
          .ok());
  Preprocessing q;
  std::string text = m.preprocessing.ToJson();
  text.insert(text.size() - 1, R"(,"zz_future":[1,2])");  // sorts last, as ToJson writes
  REQUIRE(Preprocessing::FromJson(text, "t", &q).ok());
  CHECK(q.complete);
  CHECK(q.extra.at("zz_future") == "[1,2]");
  CHECK(q.ToJson() == text);
  CHECK(RecipeChanges(m.preprocessing, q) == "zz_future: null -> [1,2]");
}

TEST_CASE("a recipe field of the wrong type is an error naming it", "[manifest]") {
  Preprocessing p;
  Status s = Preprocessing::FromJson(R"({"mean": "half"})", "cache/manifest.json", &p);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("cache/manifest.json") && Catch::Contains("mean"));
  CHECK(Preprocessing::FromJson(R"({"norm": "weird"})", "m", &p).IsInvalidArgument());
  CHECK(Preprocessing::FromJson("[1]", "m", &p).IsCorruption());
}

TEST_CASE("norm kinds parse from their names only", "[manifest]") {
  for (NormKind k : {NormKind::kNone, NormKind::kImagenet, NormKind::kAuto, NormKind::kExplicit}) {
    NormKind back;
    REQUIRE(ParseNormKind(NormKindName(k), &back).ok());
    CHECK(back == k);
  }
  NormKind k;
  CHECK(ParseNormKind("Imagenet", &k).IsInvalidArgument());
}

TEST_CASE("the seeded sample is a fixed list for a seed, on every standard library", "[shuffle]") {
  // Fisher-Yates over std::mt19937_64 with rng() % i: these values follow
  // from the C++ standard's definition of mt19937_64 alone.
  CHECK(SeededSample(20, 5, 12345) == std::vector<size_t>{0, 7, 9, 13, 16});
  CHECK(SeededSample(10, 0, 1) == std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(SeededSample(3, 7, 1) == std::vector<size_t>{0, 1, 2});
  std::vector<int> v = {0, 1, 2, 3, 4, 5, 6, 7};
  SeededShuffle(&v, 7);
  CHECK(v == std::vector<int>{2, 3, 5, 6, 1, 0, 4, 7});
}
