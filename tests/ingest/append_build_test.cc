// kiln build --append: files added to SRC become records after the cache's,
// in new shards; a changed or removed source, or other options, are refused.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "ingest_test_util.h"
#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "sources_tsv.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// Fashion-MNIST's sample with the files of the classes in `held_back` and
// every third file of the others moved to `extra` (same relative paths).
void SplitFashion(const std::string& src, const std::string& extra) {
  fs::copy(kFashion, src, fs::copy_options::recursive);
  int k = 0;
  for (const auto& cls : fs::directory_iterator(src)) {
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(cls.path())) files.push_back(f.path());
    std::sort(files.begin(), files.end());
    const bool whole = cls.path().filename().string().rfind("5_", 0) == 0;  // a new class
    for (const fs::path& f : files) {
      if (!whole && k++ % 3 != 0) continue;
      const fs::path to = fs::path(extra) / cls.path().filename() / f.filename();
      fs::create_directories(to.parent_path());
      fs::rename(f, to);
    }
    if (whole) fs::remove(cls.path());
  }
}

// Moves everything under `extra` into `src`.
void AddFiles(const std::string& extra, const std::string& src) {
  for (const auto& f : fs::recursive_directory_iterator(extra)) {
    if (!f.is_regular_file()) continue;
    const fs::path to = fs::path(src) / fs::relative(f.path(), extra);
    fs::create_directories(to.parent_path());
    fs::rename(f.path(), to);
  }
}

ingest::BuildOptions Options(const std::string& src, const std::string& out) {
  ingest::BuildOptions o = BuildOf(src, out);
  o.channels = 1;
  o.norm = NormKind::kAuto;
  o.shard_size = 60 * 28 * 28 * 2;  // several shards
  return o;
}

// record -> the bytes of its payload and its label's class name.
std::map<std::string, std::pair<std::string, std::string>> RecordsBySource(const std::string& dir) {
  std::vector<ingest::RecordedSource> sources;
  REQUIRE(ingest::ReadSourcesTsv(dir + "/" + kSourcesTsvName, &sources).ok());
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(dir, ReaderOptions(), &r).ok());
  auto txn = r->BeginRead();
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (const ingest::RecordedSource& s : sources) {
    if (s.record < 0) continue;
    RecordView v;
    REQUIRE(txn->Get(static_cast<uint64_t>(s.record), &v, true).ok());
    out[s.item.rel_path] = {std::string(reinterpret_cast<const char*>(v.data), v.bytes),
                            r->manifest().classes.at(static_cast<size_t>(v.label))};
  }
  return out;
}

}  // namespace

TEST_CASE("kiln build --append adds the new files after the cache's records", "[build][append]") {
  TempDir src, extra, out, fresh;
  SplitFashion(src.path(), extra.path());
  ingest::BuildOptions o = Options(src.path(), out.path());
  REQUIRE(Build(o).status.ToString() == "OK");
  Manifest before;
  REQUIRE(ReadManifest(out.path(), &before).ok());
  const auto old_files = CacheFiles(out.path());
  AddFiles(extra.path(), src.path());

  ingest::BuildOptions a = o;
  a.append = true;
  const Built appended = Build(a);
  REQUIRE(appended.status.ToString() == "OK");
  CHECK_THAT(appended.log, Catch::Contains("appended"));
  Manifest after;
  REQUIRE(ReadManifest(out.path(), &after).ok());
  CHECK(after.count == 300);
  REQUIRE(after.appends.size() == 1);
  CHECK(after.appends[0].count_before == before.count);
  CHECK(after.appends[0].count_after == 300);
  // The old shards are untouched, the old classes keep their indices and
  // the new class comes last.
  for (const auto& [name, bytes] : old_files)
    if (name != kManifestName) CHECK(ReadFile(out / name) == bytes);
  REQUIRE(after.classes.size() == 10);
  CHECK(std::equal(before.classes.begin(), before.classes.end(), after.classes.begin()));
  CHECK(after.classes.back().rfind("5_", 0) == 0);
  // --norm auto: the cache's statistics, not new ones.
  CHECK(after.preprocessing.mean == before.preprocessing.mean);
  CHECK(Problems(out.path()).empty());
  // Every file's record holds what a fresh build of the grown tree makes
  // of it, with the same class name.
  ingest::BuildOptions f = Options(src.path(), fresh.path());
  f.norm = NormKind::kExplicit;
  f.mean = before.preprocessing.mean;
  f.std = before.preprocessing.std;
  REQUIRE(Build(f).status.ToString() == "OK");
  const auto got = RecordsBySource(out.path()), want = RecordsBySource(fresh.path());
  REQUIRE(got.size() == 300);
  CHECK(got == want);
  // A build without --append measures --norm auto's statistics over the
  // grown tree: other statistics, so it calls the cache stale; a second
  // append has nothing to do.
  const Built again = Build(o);
  CHECK(again.status.IsStale());
  CHECK_THAT(again.status.message(), Catch::Contains("mean"));
  const Built nothing = Build(a);
  REQUIRE(nothing.status.ToString() == "OK");
  CHECK_THAT(nothing.log, Catch::Contains("nothing to append"));
}

TEST_CASE("kiln build --append refuses changed or removed sources and other options",
          "[build][append]") {
  TempDir src, extra, out;
  SplitFashion(src.path(), extra.path());
  ingest::BuildOptions o = Options(src.path(), out.path());
  REQUIRE(Build(o).status.ToString() == "OK");
  const auto files = CacheFiles(out.path());
  AddFiles(extra.path(), src.path());
  ingest::BuildOptions a = o;
  a.append = true;
  fs::path victim;
  for (const auto& f : fs::recursive_directory_iterator(src.path()))
    if (f.is_regular_file() && victim.empty() &&
        f.path().parent_path().filename().string().rfind("0_", 0) == 0)
      victim = f.path();
  REQUIRE(!victim.empty());
  SECTION("a source that changed") {
    WriteFile(victim.string(), ReadFile(victim.string()) + "x");
    const Built b = Build(a);
    CHECK_THAT(b.status.message(), Catch::Contains(victim.filename().string()) &&
                                       Catch::Contains("changed") && Catch::Contains("rebuild"));
  }
  SECTION("a source that is gone") {
    fs::remove(victim);
    const Built b = Build(a);
    CHECK_THAT(b.status.message(), Catch::Contains(victim.filename().string()) &&
                                       Catch::Contains("no longer"));
  }
  SECTION("other options") {
    a.dtype = DType::kFloat32;
    const Built b = Build(a);
    CHECK_THAT(b.status.message(), Catch::Contains("other options") && Catch::Contains("dtype"));
  }
  SECTION("with --force") {
    a.force = true;
    CHECK_THAT(Build(a).status.message(), Catch::Contains("excludes --force"));
  }
  CHECK(CacheFiles(out.path()) == files);
}

TEST_CASE("after --append with fixed normalization the cache is up to date with the grown tree",
          "[build][append]") {
  TempDir src, extra, out;
  SplitFashion(src.path(), extra.path());
  ingest::BuildOptions o = Options(src.path(), out.path());
  o.norm = NormKind::kNone;
  o.val_fraction = 0.2;  // two caches, each appended to
  REQUIRE(Build(o).status.ToString() == "OK");
  // One new file holds an old file's pixels: the report finds it across old and new.
  fs::path old_file;
  for (const auto& f : fs::recursive_directory_iterator(src.path()))
    if (f.is_regular_file() && old_file.empty()) old_file = f.path();
  AddFiles(extra.path(), src.path());
  fs::copy_file(old_file, old_file.parent_path() / "zz_again.png");
  ingest::BuildOptions a = o;
  a.append = true;
  const Built appended = Build(a);
  REQUIRE(appended.status.ToString() == "OK");
  CHECK(appended.result.duplicates.repeats == 1);
  CHECK_THAT(ReadFile(out / kDuplicatesTsvName), Catch::Contains("zz_again.png"));
  uint64_t total = 0;
  for (const char* split : {"train", "val"}) {
    Manifest m;
    REQUIRE(ReadManifest(out / split, &m).ok());
    CHECK(m.appends.size() == 1);
    total += m.count;
    CHECK(Problems(out / split).empty());
  }
  CHECK(total == 301);
  const Built again = Build(o);
  REQUIRE(again.status.ToString() == "OK");
  CHECK(again.result.up_to_date);
}
