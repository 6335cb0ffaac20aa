// kiln build's duplicate report: OUT/duplicates.tsv and the counts.
#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>

#include "duplicate_report.h"
#include "ingest_test_util.h"
#include "kiln/manifest.h"
#include "kiln/cache_layout.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// The first `per_class` images of each of the first `classes` Fashion classes.
void CopyFashion(const std::string& root, int classes, int per_class) {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kFashion)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (int c = 0; c < classes; ++c) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dirs[c])) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    fs::create_directories(root + "/" + dirs[c].filename().string());
    for (int i = 0; i < per_class; ++i)
      fs::copy_file(files[i], root + "/" + dirs[c].filename().string() + "/" +
                                  files[i].filename().string());
  }
}

std::vector<std::string> Lines(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

}  // namespace

TEST_CASE("kiln build reports the duplicates it was given, and none where there are none",
          "[build][duplicates]") {
  TempDir src, out;
  CopyFashion(src.path(), 3, 10);
  ingest::BuildOptions o = BuildOf(src.path(), out / "c");
  o.channels = 1;
  o.dtype = DType::kUint8;
  Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.duplicates_file == out / "c/duplicates.tsv");
  CHECK(b.result.duplicates.groups == 0);
  CHECK(Lines(out / "c/duplicates.tsv") ==
        std::vector<std::string>{"group\tsplit\trecord\tlabel\tclass\tpath"});
  // Up to date: nothing is read again, the report stays.
  b = Build(o);
  REQUIRE(b.result.up_to_date);
  CHECK(b.result.duplicates_file == "");
  CHECK(fs::exists(out / "c/duplicates.tsv"));

  // One image twice in its class (another name), once more under another
  // class: a group of three, with different labels.
  const std::string a = src / "0_tshirt_top/00001.png";
  fs::copy_file(a, src / "0_tshirt_top/zz_copy.png");
  fs::copy_file(a, src / "1_trouser/00001_again.png");
  o.force = true;
  b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.duplicates.groups == 1);
  CHECK(b.result.duplicates.repeats == 2);
  CHECK(b.result.duplicates.label_conflicts == 1);
  CHECK(b.result.duplicates.overlap == 0);
  // Records follow the sorted paths: 0_tshirt_top/00001.png is record 0,
  // zz_copy.png record 10, 1_trouser/00001_again.png record 11.
  CHECK(Lines(out / "c/duplicates.tsv") ==
        std::vector<std::string>{"group\tsplit\trecord\tlabel\tclass\tpath",
                                 "0\t-\t0\t0\t0_tshirt_top\t0_tshirt_top/00001.png",
                                 "0\t-\t10\t0\t0_tshirt_top\t0_tshirt_top/zz_copy.png",
                                 "0\t-\t11\t1\t1_trouser\t1_trouser/00001_again.png"});
  CHECK(Problems(out / "c") == "");  // the report is no stranger to verify
}

TEST_CASE("kiln build --val-fraction: an image in both splits is leakage", "[build][duplicates]") {
  TempDir src, out;
  CopyFashion(src.path(), 2, 20);
  // Eight copies of one image: the path hash sends some to val, some to train.
  for (int i = 0; i < 8; ++i)
    fs::copy_file(src / "0_tshirt_top/00001.png",
                  src / ("0_tshirt_top/copy" + std::to_string(i) + ".png"));
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.channels = 1;
  o.val_fraction = 0.3;
  const Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.duplicates_file == out / "duplicates.tsv");
  const std::vector<std::string> lines = Lines(out / "duplicates.tsv");
  REQUIRE(lines.size() == 1 + 9);  // one group of nine
  uint64_t in_val = 0, in_train = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    CHECK(lines[i].rfind("0\t", 0) == 0);
    (lines[i].find("\tval\t") != std::string::npos ? in_val : in_train) += 1;
  }
  REQUIRE(in_val > 0);
  REQUIRE(in_train > 0);
  CHECK(b.result.duplicates.groups == 1);
  CHECK(b.result.duplicates.overlap == in_val);
  // Train members come first.
  CHECK(lines[1].find("\ttrain\t") != std::string::npos);
}

TEST_CASE("a build in parts gets its duplicate report from kiln merge, equal to one build's",
          "[build][duplicates][merge]") {
  TempDir src, whole, parts;
  CopyFashion(src.path(), 2, 12);
  // A trouser image again among the t-shirts.
  fs::copy_file(fs::directory_iterator(src / "1_trouser")->path(), src / "0_tshirt_top/dup.png");
  ingest::BuildOptions o = BuildOf(src.path(), whole.path());
  o.channels = 1;
  o.val_fraction = 0.25;
  REQUIRE(Build(o).status.ToString() == "OK");
  o.out = parts.path();
  o.num_parts = 2;
  for (int p = 0; p < 2; ++p) {
    o.part = p;
    const Built b = Build(o);
    REQUIRE(b.status.ToString() == "OK");
    CHECK(b.result.duplicates_file == "");
  }
  CHECK_FALSE(fs::exists(parts / "duplicates.tsv"));
  ingest::MergeResult m;
  REQUIRE(ingest::MergeParts(parts.path(), {}, false, nullptr, &m).ok());
  CHECK(m.duplicates.repeats == 1);
  CHECK(ReadFile(parts / "duplicates.tsv") == ReadFile(whole / "duplicates.tsv"));
}

TEST_CASE("the report keeps each shard's fingerprints, named by its digest, and reads them again",
          "[build][duplicates]") {
  TempDir src, out;
  CopyFashion(src.path(), 2, 12);
  fs::copy_file(fs::directory_iterator(src / "1_trouser")->path(), src / "0_tshirt_top/dup.png");
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.channels = 1;
  o.shard_size = 8 * 28 * 28 * 2;  // several shards
  const Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.duplicates.repeats == 1);
  Manifest m;
  REQUIRE(ReadManifest(out.path(), &m).ok());
  REQUIRE(m.shards.size() > 1);
  const std::string kept = out / kFingerprintsDirName;
  for (const ShardInfo& s : m.shards)
    CHECK(fs::file_size(kept + "/" + s.file + "." + s.digest) == s.count * 24);
  const std::vector<ingest::SplitCache> caches = {{"", out.path()}};
  // Read back: the files are what the report uses (zeroed prints make every
  // record of the first shard a duplicate of the others there).
  const std::string first = kept + "/" + m.shards[0].file + "." + m.shards[0].digest;
  WriteFile(first, std::string(m.shards[0].count * 24, '\0'));
  DuplicateCounts c;
  REQUIRE(ingest::ReportDuplicates(out.path(), caches, 1, &c).ok());
  CHECK(c.repeats >= m.shards[0].count - 1);
  // A file that names another digest (its shard was rewritten) is not read,
  // and goes; the shard's prints are made again.
  fs::rename(first, kept + "/" + m.shards[0].file + ".0000000000000000");
  REQUIRE(ingest::ReportDuplicates(out.path(), caches, 1, &c).ok());
  CHECK(c.repeats == 1);
  CHECK_FALSE(fs::exists(kept + "/" + m.shards[0].file + ".0000000000000000"));
  CHECK(fs::file_size(first) == m.shards[0].count * 24);
}
