// Pins the bytes of small caches built from sample_data/, so that a change
// of the ingest code that alters what a build writes shows here: every
// shard file's XXH3-64 and the manifest's per-shard digests and
// preprocessing fields that shape the tensors. A deliberate format change
// updates these values in the same commit, saying why.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {
const std::string kData = KILN_SAMPLE_DATA;

// "name=xxh3hex" for every shard file of DIR, in name order, joined by ' '.
std::string ShardHashes(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) != 0 || n.size() < 4 || n.compare(n.size() - 4, 4, ".mdb") != 0)
      continue;
    const std::string bytes = ReadFile(e.path().string());
    files[n] = DigestHex(XXH3_64bits(bytes.data(), bytes.size()));
  }
  std::string out;
  for (const auto& [n, h] : files) out += (out.empty() ? "" : " ") + n + "=" + h;
  return out;
}

// The manifest fields that do not depend on where the test runs.
std::string ManifestSummary(const std::string& dir) {
  Manifest m;
  REQUIRE(ReadManifest(dir, &m).ok());
  const nlohmann::json j = nlohmann::json::parse(ReadFile(dir + "/manifest.json"));
  std::string out = std::to_string(m.count) + " " + m.shape.ToString() + " " + DTypeName(m.dtype);
  for (const ShardInfo& s : m.shards) out += " " + s.digest;
  const auto& pre = j.at("preprocessing");
  for (const char* k : {"mean", "std", "norm", "resize", "crop", "size", "split"})
    out += std::string(" ") + k + "=" + pre.at(k).dump();
  return out;
}

// A list file naming sample_data/photos' images with labels 0, 1, 2, 0, ...
std::string PhotoList(const TempDir& dir) {
  std::string text;
  int k = 0;
  for (const char* n :
       {"astronaut", "camera", "chelsea", "coffee", "hubble_deep_field", "retina", "rocket"})
    text += std::string(n) + ".jpg " + std::to_string(k++ % 3) + "\n";
  WriteFile(dir / "photos.txt", text);
  return dir / "photos.txt";
}

ingest::BuildOptions Options(const std::string& src, const std::string& out) {
  ingest::BuildOptions o;
  o.src = src;
  o.out = out;
  o.threads = 2;
  return o;
}
}  // namespace

TEST_CASE("golden: fashion float16, explicit mean/std, shuffled, split, several shards",
          "[build][golden]") {
  TempDir out;
  auto o = Options(kData + "/fashion/train", out.path());
  o.channels = 1;
  o.norm = NormKind::kExplicit;
  o.mean = {0.286};
  o.std = {0.353};
  o.shuffle_seed = 11;
  o.val_fraction = 0.25;
  o.shard_size = 64 * 28 * 28 * 2;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  CHECK(ShardHashes(out / "train") ==
        "shard-00000.mdb=57d5b8659ad01a8c shard-00001.mdb=3a47a6be205c4836 "
        "shard-00002.mdb=655f7ce857543374 shard-00003.mdb=dd1410f452ab22f8");
  CHECK(ManifestSummary(out / "train") ==
        "228 1x28x28 float16 5e503054341a2158 3732b0c6dd8a0e0e 259503d875204b8d "
        "7bd670a26dffa8e7 mean=[0.286] std=[0.353] norm=\"explicit\" resize=0 crop=0 "
        "size=[0,0] split=\"train\"");
  CHECK(ShardHashes(out / "val") ==
        "shard-00000.mdb=4e2e3f114734818c shard-00001.mdb=9f5050eca933f9da");
  CHECK(ManifestSummary(out / "val") ==
        "72 1x28x28 float16 b8031fedb47ddcae ccef48015556236a mean=[0.286] std=[0.353] "
        "norm=\"explicit\" resize=0 crop=0 size=[0,0] split=\"val\"");
}

TEST_CASE("golden: photos uint8, resize and center crop", "[build][golden]") {
  TempDir out;
  TempDir lists;
  auto o = Options(kData + "/photos", out.path());
  o.list_file = PhotoList(lists);
  o.resize = 64;
  o.crop = 56;
  o.dtype = DType::kUint8;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  CHECK(ShardHashes(out.path()) == "shard-00000.mdb=6d9e82cf3c51d199");
  CHECK(ManifestSummary(out.path()) ==
        "7 3x56x56 uint8 a331b93091820350 mean=[0.0,0.0,0.0] std=[1.0,1.0,1.0] "
        "norm=\"none\" resize=64 crop=56 size=[0,0] split=\"\"");
}

TEST_CASE("golden: photos float32, imagenet statistics, squashed to 40x30", "[build][golden]") {
  TempDir out;
  TempDir lists;
  auto o = Options(kData + "/photos", out.path());
  o.list_file = PhotoList(lists);
  o.size_w = 40;
  o.size_h = 30;
  o.dtype = DType::kFloat32;
  o.norm = NormKind::kImagenet;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  CHECK(ShardHashes(out.path()) == "shard-00000.mdb=369e8b159c952ca5");
  CHECK(ManifestSummary(out.path()) ==
        "7 3x30x40 float32 bdcfdc5d141d0ab7 mean=[0.485,0.456,0.406] "
        "std=[0.229,0.224,0.225] norm=\"imagenet\" resize=0 crop=0 size=[40,30] split=\"\"");
}

TEST_CASE("golden: fashion norm auto over all images, grey photos", "[build][golden]") {
  TempDir out;
  auto o = Options(kData + "/fashion/val", out.path());
  o.channels = 1;
  o.norm = NormKind::kAuto;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  CHECK(ShardHashes(out.path()) == "shard-00000.mdb=6a7c39c84e9b3e59");
  CHECK(ManifestSummary(out.path()) ==
        "100 1x28x28 float16 fe129fa3b66dc50d mean=[0.28392026810724286] "
        "std=[0.35388319851093486] norm=\"auto\" resize=0 crop=0 size=[0,0] split=\"\"");
}

TEST_CASE("golden: norm auto over a seeded sample of 40 images", "[build][golden]") {
  // The sample comes from kiln's own SeededSample (kiln/shuffle.h), not
  // std::shuffle, so these bytes are the same with every standard library.
  TempDir out;
  auto o = Options(kData + "/fashion/train", out.path());
  o.channels = 1;
  o.norm = NormKind::kAuto;
  o.stats_sample = 40;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  CHECK(ShardHashes(out.path()) == "shard-00000.mdb=daf8e11cbaa87af7");
  CHECK(ManifestSummary(out.path()) ==
        "300 1x28x28 float16 f63f1c508b087435 mean=[0.28901485594237697] "
        "std=[0.35650513775356324] norm=\"auto\" resize=0 crop=0 size=[0,0] split=\"\"");
}
