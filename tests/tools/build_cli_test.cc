// The kiln build, merge and verify --level sources|deep commands: their
// flags, the lines they print and their exit codes (0 ok, 1 bad data, 2
// usage or environment). What the caches hold is tested through the
// library in tests/ingest.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>
#include <sstream>

#include "ingest/ingest_test_util.h"
#include "kiln/manifest.h"
#include "core/units.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {
int Kiln(const std::string& args, std::string* out) {
  return RunCommand(std::string(KILN_BIN) + " " + args, out);
}

// A duration as units.h's FormatDuration writes it ("24 ms", "1.23 s",
// "2 min 05 s"), never a raw double such as "0.0239152 s".
const std::string kDuration =
    R"((\d{1,3}(\.\d)? ms|\d{1,2}\.\d{1,2} s|\d+ min \d\d s|\d+ h \d\d min))";
const std::string kBytes = R"(\d+(\.\d)? [KMGT]?B)";

// The line of `log` that starts with `prefix` ("" when none).
std::string LineOf(const std::string& log, const std::string& prefix) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, prefix.size(), prefix) == 0) return line;
  return "";
}
}  // namespace

TEST_CASE("kiln build: flags into options, its summary, up to date, stale exits 1", "[cli]") {
  TempDir out;
  const std::string cmd = "build " + kFashion + " " + out.path() + " --channels 1 --progress none";
  std::string log;
  REQUIRE(Kiln(cmd + " --dtype float16 --mean 0.5 --std 0.25", &log) == 0);
  CHECK_THAT(log, Catch::Contains("kiln build: 300 written, 0 rejected") &&
                      Catch::Contains("-> " + out.path()));
  // Time and rate in human units.
  CHECK_THAT(LineOf(log, "kiln build:"),
             Catch::Matches("kiln build: 300 written, 0 rejected in " + kDuration + " \\(" +
                            kBytes + ", " + kBytes + "/s\\) -> .*"));
  const auto first = CacheFiles(out.path());
  Manifest m;
  REQUIRE(ReadManifest(out.path(), &m).ok());
  CHECK(m.shape.ToString() == "1x28x28");
  CHECK(m.dtype == DType::kFloat16);
  CHECK(m.preprocessing.norm == NormKind::kExplicit);
  CHECK(m.preprocessing.mean == std::vector<double>{0.5});
  CHECK(m.preprocessing.std == std::vector<double>{0.25});
  REQUIRE(Kiln(cmd + " --mean 0.5 --std 0.25", &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date"));
  CHECK_THAT(log, !Catch::Contains("written"));
  // --force rebuilds it, to the same bytes; --rebuild-if-changed keeps it.
  fs::remove(out / ShardFileName(0));
  REQUIRE(Kiln(cmd + " --mean 0.5 --std 0.25 --force", &log) == 0);
  CHECK_THAT(log, Catch::Contains("rebuilding from scratch (--force)") &&
                      Catch::Contains("kiln build: 300 written"));
  CHECK(CacheFiles(out.path()) == first);
  REQUIRE(Kiln(cmd + " --mean 0.5 --std 0.25 --rebuild-if-changed", &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date") && !Catch::Contains("written"));
  REQUIRE(Kiln("build --help", &log) == 0);
  CHECK_THAT(
      log, Catch::Contains("even an up-to-date cache") && Catch::Contains("--rebuild-if-changed"));
  CHECK(Kiln(cmd + " --mean 0.5 --std 0.25 --dtype float32", &log) == 1);
  CHECK_THAT(log, Catch::Contains("dtype") && Catch::Contains("--force"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);
  CHECK_THAT(log, Catch::Contains("OK: the cache is intact"));
  CHECK_THAT(LineOf(log, "kiln verify"),
             Catch::Matches("kiln verify .* \\(level full\\): 300 records, " + kBytes +
                            " checksummed in " + kDuration + " \\(" + kBytes + "/s\\)"));
}

TEST_CASE("kiln build names the first rejected input, and under --strict it exits 1", "[cli]") {
  TempDir src, out, strict_out;
  fs::create_directories(src / "a");
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "a/good.jpg");
  WriteFile(src / "a/bad.jpg", "this is not an image\n");
  const std::string opts = " --resize 32 --progress none";
  std::string log;
  REQUIRE(Kiln("build " + src.path() + " " + out.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("1 written, 1 rejected"));
  CHECK_THAT(log,
             Catch::Contains("listed in rejects.tsv; the first: ") && Catch::Contains("a/bad.jpg"));
  CHECK(Kiln("build " + src.path() + " " + strict_out.path() + opts + " --strict", &log) == 1);
  CHECK_THAT(log, Catch::Contains("a/bad.jpg") && Catch::Contains("--strict"));
  CHECK_FALSE(fs::exists(strict_out / "manifest.json"));
}

TEST_CASE("kiln build: usage and environment errors exit 2", "[cli]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 1);
  const std::string cmd = "build " + src.path() + " " + out.path() + " --progress none";
  std::string log;
  SECTION("flags that do not parse or do not go together") {
    CHECK(Kiln(cmd + " --size 32", &log) == 2);
    CHECK_THAT(log, Catch::Contains("--size '32'"));
    CHECK(Kiln(cmd + " --mean 0.5,0.5,0.5", &log) == 2);
    CHECK_THAT(log, Catch::Contains("--mean and --std go together"));
    CHECK(Kiln(cmd + " --norm imagenet --mean 0.5,0.5,0.5 --std 1,1,1", &log) == 2);
    CHECK(Kiln(cmd + " --norm bogus", &log) == 2);
    CHECK(Kiln(cmd + " --dtype int7", &log) == 2);
    CHECK(Kiln(cmd + " --shard-size lots", &log) == 2);
    CHECK(Kiln(cmd + " --num-parts 3", &log) == 2);
    CHECK_THAT(log, Catch::Contains("--num-parts and --part go together"));
    CHECK(Kiln(cmd + " --num-parts 3 --part 3", &log) == 2);
    CHECK(Kiln(cmd + " --progress sometimes", &log) == 2);
    CHECK_FALSE(fs::exists(out / "manifest.json"));
  }
  SECTION("another build holds OUT; --repair with other arguments") {
    REQUIRE(Kiln(cmd + " --resize 32", &log) == 0);
    const int fd = ::open((out / ".kiln.lock").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK(Kiln(cmd + " --resize 32 --dtype float32 --force", &log) == 2);
    CHECK_THAT(log, Catch::Contains("in use"));
    ::close(fd);
    CHECK(Kiln(cmd + " --resize 40 --repair", &log) == 2);
    CHECK_THAT(log, Catch::Contains("original build"));
    CHECK(Kiln(cmd + " --resize 32 --repair", &log) == 0);
    CHECK_THAT(log, Catch::Contains("nothing to repair"));
    CHECK(Kiln(cmd + " --resize 32 --repair --force", &log) == 2);
    CHECK_THAT(log, Catch::Contains("give one of them"));
  }
}

TEST_CASE("kiln build takes its part from the launcher's environment, and kiln merge joins them",
          "[cli]") {
  TempDir parts;
  const std::string opts = " --channels 1 --val-fraction 0.2 --progress none";
  const std::string build = std::string(KILN_BIN) + " build " + kFashion + " ";
  std::string log;
  REQUIRE(RunCommand("RANK=0 WORLD_SIZE=2 " + build + parts.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("part 0 of 2 (from RANK/WORLD_SIZE)"));
  REQUIRE(RunCommand("SLURM_PROCID=1 SLURM_NTASKS=2 " + build + parts.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("part 1 of 2 (from SLURM_PROCID/SLURM_NTASKS)"));
  REQUIRE(fs::exists(parts / "train/part-00001-of-00002/manifest.json"));
  REQUIRE(fs::exists(parts / "val/part-00000-of-00002/manifest.json"));
  CHECK(RunCommand("RANK=3 WORLD_SIZE=2 " + build + parts.path() + "/x" + opts, &log) == 2);
  CHECK_THAT(log, Catch::Contains("not a rank within the world size"));
  CHECK_FALSE(fs::exists(parts / "x"));
  // A part can be verified and looked at before the merge.
  CHECK(Kiln("verify " + parts / "train/part-00000-of-00002", &log) == 0);
  CHECK(Kiln("inspect " + parts / "train/part-00000-of-00002", &log) == 0);
  REQUIRE(Kiln("merge " + parts.path(), &log) == 0);
  CHECK_THAT(log,
             Catch::Contains("kiln merge: 4 parts") && Catch::Contains("no tensor data copied"));
  CHECK_THAT(LineOf(log, "kiln merge:"),
             Catch::Matches("kiln merge: 4 parts, 300 records in \\d+ shards, in " + kDuration +
                            " -> .* \\(no tensor data copied\\)"));
  CHECK(Kiln("verify " + parts.path(), &log) == 0);
  // Nothing left to merge: a usage error.
  CHECK(Kiln("merge " + parts.path(), &log) == 2);
  CHECK_THAT(log, Catch::Contains("no part-*-of-* directories"));
}

TEST_CASE("kiln merge --from joins finished caches, and a difference is a usage error", "[cli]") {
  TempDir a, b, c, out;
  std::string log;
  const std::string build = "build " + kFashion + " ";
  REQUIRE(Kiln(build + a.path() + " --channels 1 --progress none", &log) == 0);
  REQUIRE(Kiln(build + b.path() + " --channels 1 --progress none", &log) == 0);
  REQUIRE(Kiln(build + c.path() + " --channels 1 --resize 32 --progress none", &log) == 0);
  REQUIRE(Kiln("merge --from " + a.path() + " --from " + b.path() + " " + out.path(), &log) == 0);
  CHECK_THAT(LineOf(log, "kiln merge:"),
             Catch::Matches("kiln merge: 2 caches, 600 records in \\d+ shards, in " + kDuration +
                            " -> " + out.path() + " \\(no tensor data copied\\)"));
  // The same images twice: the duplicate report says so.
  CHECK_THAT(log, Catch::Contains("300"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);
  // inspect names B's shards as linked, with their keys in B.
  REQUIRE(Kiln("inspect " + out.path(), &log) == 0);
  std::string first_of_b;
  std::istringstream lines(log);
  for (std::string l; std::getline(lines, l);)
    if (l.find("  records 300..") != std::string::npos) first_of_b = l;
  CHECK_THAT(first_of_b, Catch::Contains("linked, keys 0.."));
  TempDir out2;
  CHECK(Kiln("merge --from " + a.path() + " --from " + c.path() + " " + out2.path(), &log) == 2);
  CHECK_THAT(log, Catch::Contains("resize"));
  CHECK(Kiln("merge --from " + a.path() + " --from " + b.path() + " " + out2.path() + " " +
                 a.path(),
             &log) == 2);
  CHECK_THAT(log, Catch::Contains("PART arguments"));
}

TEST_CASE("kiln verify OUT of a --val-fraction build checks both splits", "[cli]") {
  TempDir out;
  std::string log;
  REQUIRE(Kiln("build " + kFashion + " " + out.path() +
                   " --channels 1 --val-fraction 0.2 --progress none",
               &log) == 0);
  CHECK_THAT(log, Catch::Contains(out / "train") && Catch::Contains(out / "val"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);
  CHECK_THAT(log, Catch::Contains(out / "train") && Catch::Contains(out / "val"));
  CHECK(Kiln("verify " + out.path() + " --json", &log) == 0);
  CHECK_THAT(log, Catch::Contains("\"splits\"") && Catch::Contains("\"val\""));
  fs::remove(out / "val/manifest.json");
  CHECK(Kiln("verify " + out.path(), &log) == 1);
  CHECK_THAT(log, Catch::Contains("incomplete"));
}

TEST_CASE("kiln verify --level sources and deep: exit 1 naming the record's source", "[cli]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 2);
  const std::string cache = out / "c";
  std::string log;
  REQUIRE(Kiln("build " + src.path() + " " + cache + " --resize 40 --crop 32 --progress none",
               &log) == 0);
  for (const char* level : {"quick", "full", "sources", "deep"}) {
    INFO(level);
    CHECK(Kiln("verify " + cache + " --level " + level + " --sample 0", &log) == 0);
    CHECK_THAT(log, Catch::Contains(std::string("(level ") + level + ")"));
  }
  CHECK(Kiln("verify " + cache + " --level everything", &log) == 2);
  const std::string victim =
      "dogs/" + fs::directory_iterator(src / "dogs")->path().filename().string();
  WriteFile(src / victim, ReadFile(src / victim) + "x");
  CHECK(Kiln("verify " + cache + " --level full", &log) == 0);
  CHECK(Kiln("verify " + cache + " --level sources", &log) == 1);
  CHECK_THAT(log, Catch::Contains("PROBLEM record ") && Catch::Contains("(" + victim + ")") &&
                      Catch::Contains("changed"));
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "cats/new.jpg");
  CHECK(Kiln("verify " + cache + " --level sources --json", &log) == 1);
  CHECK_THAT(log, Catch::Contains("\"source\": \"cats/new.jpg\"") && Catch::Contains("added"));
  CHECK(Kiln("verify " + cache + " --level deep --sample 0", &log) == 1);
}

TEST_CASE("kiln verify VAL --against TRAIN: val records also in train exit 1, naming them",
          "[cli][duplicates]") {
  TempDir val_src, out;
  // Fashion's val images and three of its train images.
  fs::copy(std::string(KILN_SAMPLE_DATA) + "/fashion/val", val_src.path(),
           fs::copy_options::recursive);
  std::vector<fs::path> train_files;
  for (const auto& e : fs::recursive_directory_iterator(kFashion))
    if (e.is_regular_file()) train_files.push_back(e.path());
  std::sort(train_files.begin(), train_files.end());
  for (int i = 0; i < 3; ++i)
    fs::copy_file(train_files[i * 50], val_src / ("0_tshirt_top/from_train" + std::to_string(i) +
                                                  ".png"));
  const std::string opts = " --channels 1 --dtype uint8 --progress none";
  std::string log;
  REQUIRE(Kiln("build " + kFashion + " " + out / "train" + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("duplicates: none"));
  REQUIRE(Kiln("build " + val_src.path() + " " + out / "val" + opts, &log) == 0);
  REQUIRE(Kiln("build " + std::string(KILN_SAMPLE_DATA) + "/fashion/val " + out / "clean" + opts,
               &log) == 0);

  REQUIRE(Kiln("verify " + out / "val" + " --against " + out / "train", &log) == 1);
  CHECK_THAT(log, Catch::Contains("OK: the cache is intact") &&
                      Catch::Contains("against " + out / "train" + ": 3 of 103 records are also in it") &&
                      Catch::Contains("FAILED: 3 record(s) of " + out / "val"));
  // The copies sort after val's ten t-shirts (records 10..12); train_files[i]
  // is train's record i (both sorted by path).
  CHECK_THAT(log, Catch::Contains("  record 10 = record 0 of " + out / "train\n") &&
                      Catch::Contains("  record 12 = record 100 of " + out / "train\n"));
  REQUIRE(Kiln("verify " + out / "val" + " --against " + out / "train" + " --json", &log) == 1);
  CHECK_THAT(log, Catch::Contains("\"overlap\": 3"));
  REQUIRE(Kiln("verify " + out / "clean" + " --against " + out / "train", &log) == 0);
  CHECK_THAT(log, Catch::Contains(": 0 of 100 records are also in it"));

  // Records that cannot be compared, and a parent of splits: usage errors.
  REQUIRE(Kiln("build " + val_src.path() + " " + out / "val16 --channels 1 --progress none", &log) ==
          0);
  REQUIRE(Kiln("verify " + out / "val16" + " --against " + out / "train", &log) == 2);
  CHECK_THAT(log, Catch::Contains("cannot be compared with those of " + out / "val16"));
  REQUIRE(Kiln("verify " + out.path() + " --against " + out / "train", &log) == 2);
  CHECK_THAT(log, Catch::Contains("--against compares one cache with another: give " +
                                  out / "val --against " + out / "train"));
}

TEST_CASE("kiln inspect of a built cache: its sources' size, when it finished, duplicates, RAM fit",
          "[cli]") {
  TempDir out;
  std::string log;
  REQUIRE(Kiln("build " + kFashion + " " + out.path() +
                   " --channels 1 --dtype uint8 --val-fraction 0.2 --progress none",
               &log) == 0);
  // The source bytes of val's records, summed from the files themselves.
  uint64_t bytes = 0, files = 0, disk = 0;
  std::istringstream tsv(ReadFile(out / "val/sources.tsv"));
  std::string line;
  std::getline(tsv, line);
  while (std::getline(tsv, line)) {
    const std::string record = line.substr(0, line.find('\t'));
    const std::string rest = line.substr(line.find('\t') + 1);
    if (record == "-1") continue;
    bytes += fs::file_size(kFashion + "/" + rest.substr(0, rest.find('\t')));
    ++files;
  }
  for (const auto& e : fs::directory_iterator(out / "val"))
    if (e.path().extension() == ".mdb") disk += e.file_size();
  REQUIRE(files > 0);
  REQUIRE(Kiln("inspect " + out / "val/", &log) == 0);
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.2f", static_cast<double>(disk) / bytes);
  CHECK_THAT(log, Catch::Contains("sources:       " + std::to_string(files) + " files, " +
                                  FormatByteSize(static_cast<double>(bytes)) + " (the cache is " +
                                  ratio + "x their size)\n"));
  CHECK_THAT(log, Catch::Contains("finished:      20") && Catch::Contains(" UTC (manifest.json"));
  CHECK_THAT(log, Catch::Contains("duplicates:    none (" + out / "val/../duplicates.tsv)"));
  CHECK_THAT(log, Catch::Contains("memory:        fits in this machine's "));
  // A cache made without kiln build has no sources line.
  TempDir plain;
  WriteTestCache(plain.path(), 10, DType::kUint8, MakeShape({1, 2, 2}));
  REQUIRE(Kiln("inspect " + plain.path(), &log) == 0);
  CHECK_THAT(log, !Catch::Contains("sources:") && !Catch::Contains("duplicates:"));
}

namespace {
// DIR made read-only for this process: a read-only bind mount of it as root
// (root writes through permissions), chmod a-w otherwise. Undone on
// destruction. ok() is false when neither works here.
class ReadOnlyDir {
 public:
  explicit ReadOnlyDir(const std::string& dir) : dir_(dir), view_(dir + ".ro") {
    if (::geteuid() == 0) {
      fs::create_directories(view_);
      mounted_ = ::mount(dir.c_str(), view_.c_str(), nullptr, MS_BIND, nullptr) == 0;
      if (mounted_ && ::mount(nullptr, view_.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY,
                              nullptr) != 0) {
        ::umount2(view_.c_str(), MNT_DETACH);
        mounted_ = false;
      }
    } else {
      view_ = dir;
      for (const auto& e : fs::recursive_directory_iterator(dir))
        fs::permissions(e.path(), (fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write), fs::perm_options::remove);
      fs::permissions(dir, (fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write), fs::perm_options::remove);
      chmodded_ = true;
    }
  }
  ~ReadOnlyDir() {
    if (mounted_) ::umount2(view_.c_str(), MNT_DETACH);
    if (chmodded_) {
      fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::add);
      for (const auto& e : fs::recursive_directory_iterator(dir_))
        fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
  }
  bool ok() const { return (mounted_ || chmodded_) && ::access(view_.c_str(), W_OK) != 0; }
  const std::string& path() const { return view_; }

 private:
  std::string dir_, view_;
  bool mounted_ = false, chmodded_ = false;
};
}  // namespace

TEST_CASE(
    "a cache on a read-only directory verifies, inspects, loads and trains, and readers share it",
    "[cli][read-only]") {
  TempDir dir;
  std::string log;
  // Without the LMDB lock files a reader would create: a copy made for a read-only place.
  REQUIRE(Kiln("build " + kFashion + " " + dir / "c/cache --channels 1 --progress none", &log) ==
          0);
  for (const auto& e : fs::directory_iterator(dir / "c/cache"))
    if (e.path().filename().string().find("-lock") != std::string::npos) fs::remove(e.path());
  ReadOnlyDir ro(dir / "c");
  if (!ro.ok()) {
    Skip(SkipWhy::kHostCannot, "cannot make a read-only directory here (no bind mount, no chmod)");
    return;
  }
  const std::string cache = ro.path() + "/cache";
  CHECK(Kiln("verify " + cache + " --progress none", &log) == 0);
  CHECK_THAT(log, Catch::Contains("OK: the cache is intact"));
  CHECK(Kiln("verify " + cache + " --level sources --progress none", &log) == 0);
  CHECK(Kiln("inspect " + cache, &log) == 0);
  CHECK(Kiln("bench " + cache + " --batch 32 --epochs 1", &log) == 0);
  // A build into it says why it cannot write, naming the place.
  CHECK(Kiln("build " + kFashion + " " + cache + " --channels 3 --force --progress none", &log) ==
        2);
  CHECK_THAT(log, Catch::Contains(cache) && Catch::Contains("Read-only file system") ||
                      Catch::Contains("Permission denied"));

  // Several readers at once: two verifies, a bench (and a training run when
  // kiln-train is built), all on the read-only cache.
  const bool train = fs::exists(fs::path(KILN_BIN).parent_path() / "kiln-train");
  std::vector<std::string> cmds = {"verify " + cache + " --progress none",
                                   "verify " + cache + " --progress none",
                                   "bench " + cache + " --batch 16 --epochs 2"};
  if (train)
    cmds.push_back("train --data " + cache + " --epochs 1 --batch-size 32 --log-every 0 --device cpu");
  std::string all;
  for (size_t i = 0; i < cmds.size(); ++i)
    all += std::string(KILN_BIN) + " " + cmds[i] + " > " + dir / ("r" + std::to_string(i)) +
           " 2>&1 & ";
  all += "for j in $(jobs -p); do wait $j || exit 1; done";
  CHECK(RunCommand("bash -c '" + all + "'", &log) == 0);
  for (size_t i = 0; i < cmds.size(); ++i) {
    INFO(cmds[i] << ":\n" << ReadFile(dir / ("r" + std::to_string(i))));
    const std::string out = ReadFile(dir / ("r" + std::to_string(i)));
    CHECK(out.find("error") == std::string::npos);
  }
}

TEST_CASE("OpenCV's codecs load on first use: verify and inspect run without them, "
          "build and export name the module they could not load",
          "[cli]") {
  TempDir dir;
  const fs::path src = dir / "src";
  fs::create_directories(src / "cats");
  fs::create_directories(src / "dogs");
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "cats/a.jpg");
  fs::copy_file(std::string(KILN_SAMPLE_DATA) + "/fashion/train/0_tshirt_top/00001.png",
                src / "dogs/c.png");
  std::string out;
  const std::string cache = dir / "cache";
  REQUIRE(Kiln("build " + src.string() + " " + cache + " --resize 32 --crop 32 --progress none",
               &out) == 0);
  // Only this (missing) module may be tried: the variable is the user's override.
  const std::string none = "KILN_OPENCV_CODECS=" + (dir / "no-such-module.so") + " ";
  CHECK(RunCommand(none + KILN_BIN + " verify " + cache + " --level full", &out) == 0);
  CHECK(RunCommand(none + KILN_BIN + " inspect " + cache, &out) == 0);

  const std::string other = dir / "other";
  CHECK(RunCommand(none + KILN_BIN + " build " + src.string() + " " + other +
                       " --resize 32 --crop 32 --progress none",
                   &out) == 2);
  CHECK_THAT(out, Catch::Contains("cannot load OpenCV's image codecs") &&
                      Catch::Contains("no-such-module.so: no such file") &&
                      Catch::Contains("KILN_OPENCV_CODECS"));
  CHECK_FALSE(fs::exists(other));  // stopped before it wrote anything
  CHECK(RunCommand(none + KILN_BIN + " export " + cache + " --index 0 -o " + (dir / "a.png"),
                   &out) == 2);
  CHECK_THAT(out, Catch::Contains("cannot load OpenCV's image codecs to write"));
  CHECK_FALSE(fs::exists(dir / "a.png"));
  CHECK(Kiln("export " + cache + " --index 0 -o " + (dir / "a.png"), &out) == 0);
}
