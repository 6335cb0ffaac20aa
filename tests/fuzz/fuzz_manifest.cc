// libFuzzer target: manifest.json and the preprocessing recipe (the
// manifest's "preprocessing" object, and build.json).
// Input: JSON text. Both parsers must return a Status for any text, never
// throw or crash; what they accept must write back to JSON that reads again
// to the same thing.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "kiln/manifest.h"
#include "kiln/preprocessing.h"

namespace {

void CheckManifest(const std::string& text) {
  kiln::Manifest m;
  if (!kiln::ManifestFromJson(text, "manifest.json", &m).ok()) return;
  KILN_FUZZ_CHECK(m.shape.ndim >= 1 && m.shape.ndim <= kiln::kMaxDims);
  KILN_FUZZ_CHECK(m.shape.NumElements() >= 1 && m.shape.NumElements() <= kiln::kMaxRecordElements);
  uint64_t sum = 0;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    KILN_FUZZ_CHECK(m.shards[i].first == m.first_index + sum);
    sum += m.shards[i].count;
    KILN_FUZZ_CHECK(sum >= m.shards[i].count);  // no wrap-around
  }
  KILN_FUZZ_CHECK(sum == m.count);
  if (m.count > 0) {
    KILN_FUZZ_CHECK(m.ShardFor(m.first_index) >= 0);
    KILN_FUZZ_CHECK(m.ShardFor(m.first_index + m.count - 1) >= 0);
  }
  // Written back, it reads again, and writing that gives the same text.
  const std::string written = kiln::ManifestToJson(m);
  kiln::Manifest again;
  KILN_FUZZ_CHECK(kiln::ManifestFromJson(written, "again", &again).ok());
  KILN_FUZZ_CHECK(kiln::ManifestToJson(again) == written);
  KILN_FUZZ_CHECK(kiln::PreprocessingDifferences(m, again).empty());
}

void CheckRecipe(const std::string& text) {
  kiln::Preprocessing p;
  if (!kiln::Preprocessing::FromJson(text, "build.json", &p).ok()) return;
  const std::string written = p.ToJson();
  kiln::Preprocessing again;
  KILN_FUZZ_CHECK(kiln::Preprocessing::FromJson(written, "again", &again).ok());
  KILN_FUZZ_CHECK(again == p);
  KILN_FUZZ_CHECK(kiln::RecipeChanges(p, again).empty());
  KILN_FUZZ_CHECK(kiln::TensorRecipeDifferences(p, again).empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  CheckManifest(text);
  CheckRecipe(text);
  return 0;
}
