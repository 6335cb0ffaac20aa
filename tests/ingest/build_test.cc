// BuildCache: what a cache holds, resuming, up-to-date detection, rejects,
// --strict, --force under the lock, repair. The command's own output and
// exit codes are tested in tests/tools/build_cli_test.cc.
#include "kiln/ingest/build.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ingest_test_util.h"
#include "kiln/cache_reader.h"
#include "kiln/image/decode.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// Every shard file and the manifest of a cache, by name.
double HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double s = (h & 0x8000) ? -1 : 1;
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1024 + m, e - 25);
}
}  // namespace

TEST_CASE("a build of the Fashion-MNIST sample: labels, shape, pixels", "[build]") {
  TempDir out;
  ingest::BuildOptions o = BuildOf(kFashion, out.path());
  o.channels = 1;
  o.dtype = DType::kFloat16;
  o.norm = NormKind::kExplicit;
  o.mean = {0.5};
  o.std = {0.25};
  const Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.written == 300);
  CHECK(b.result.rejected == 0);
  CHECK(b.result.caches == std::vector<std::string>{out.path()});
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
  const Manifest& m = r->manifest();
  CHECK(m.count == 300);
  CHECK(m.shape.ToString() == "1x28x28");
  CHECK(m.classes.size() == 10);
  CHECK(m.classes[0] == "0_tshirt_top");
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(kFashion, &list).ok());
  auto txn = r->BeginRead();
  for (uint64_t i : {0ull, 29ull, 30ull, 150ull, 299ull}) {
    RecordView v;
    REQUIRE(txn->Get(i, &v, true).ok());
    CHECK(v.label == list.items[i].label);
    // The record is (x/255 - 0.5) / 0.25 of the PNG's pixels, in fp16.
    const std::string png = ReadFile(list.root + "/" + list.items[i].rel_path);
    image::ImageU8 img;
    image::DecodeOptions d;
    d.channels = 1;
    REQUIRE(image::Decode(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "png", d, &img)
                .ok());
    const uint16_t* h = reinterpret_cast<const uint16_t*>(v.data);
    for (int p = 0; p < 28 * 28; p += 37) {
      const double want = (img.pixels[p] / 255.0 - 0.5) / 0.25;
      REQUIRE(std::abs(HalfToFloat(h[p]) - want) <= 2e-3);
    }
  }
  CHECK(Problems(out.path()) == "");
}

TEST_CASE("builds are byte-identical across thread counts", "[build]") {
  TempDir a, b;
  ingest::BuildOptions o;
  o.src = kFashion;
  o.channels = 1;
  o.norm = NormKind::kAuto;
  o.shuffle_seed = 7;
  o.shard_size = 100 * 28 * 28 * 2;  // several shards
  ingest::BuildResult r;
  o.out = a.path();
  o.threads = 1;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  o.out = b.path();
  o.threads = 2;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  auto fa = CacheFiles(a.path()), fb = CacheFiles(b.path());
  CHECK(fa.size() == 4);  // 3 shards + manifest
  // The manifests differ only in... nothing: same sources, same options.
  CHECK(fa == fb);
}

TEST_CASE("the same build again is up to date, --force rebuilds, changed sources need an option",
          "[build]") {
  TempDir src, out;
  fs::copy(kFashion, src.path(), fs::copy_options::recursive);
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.channels = 1;
  REQUIRE(Build(o).status.ToString() == "OK");
  const auto before = CacheFiles(out.path());
  const Built again = Build(o);
  REQUIRE(again.status.ToString() == "OK");
  CHECK(again.result.up_to_date);
  CHECK(again.result.written == 0);
  CHECK_THAT(again.log, Catch::Contains("up to date"));
  CHECK(CacheFiles(out.path()) == before);
  // --force rebuilds an up-to-date cache from scratch, to the same bytes.
  ingest::BuildOptions forced = o;
  forced.force = true;
  fs::remove(out / ShardFileName(0));  // what a rebuild must write again
  const Built rebuilt = Build(forced);
  REQUIRE(rebuilt.status.ToString() == "OK");
  CHECK_FALSE(rebuilt.result.up_to_date);
  CHECK(rebuilt.result.written == 300);
  CHECK_THAT(rebuilt.log, Catch::Contains("rebuilding from scratch (--force)"));
  CHECK(CacheFiles(out.path()) == before);
  // --rebuild-if-changed keeps an up-to-date cache.
  ingest::BuildOptions if_changed = o;
  if_changed.rebuild_if_changed = true;
  const Built kept = Build(if_changed);
  REQUIRE(kept.status.ToString() == "OK");
  CHECK(kept.result.up_to_date);
  CHECK(kept.result.written == 0);
  // Options changed.
  ingest::BuildOptions f32 = o;
  f32.dtype = DType::kFloat32;
  const Built changed = Build(f32);
  CHECK(changed.status.IsStale());
  CHECK_THAT(changed.status.message(), Catch::Contains("dtype") && Catch::Contains("--force"));
  CHECK(CacheFiles(out.path()) == before);  // nothing lost
  // A source changed.
  fs::remove(src / "3_dress/00003.png");
  const std::string first = fs::directory_iterator(src / "3_dress")->path().string();
  fs::remove(first);
  const Built stale = Build(o);
  CHECK(stale.status.IsStale());
  CHECK_THAT(stale.status.message(), Catch::Contains("source"));
  const Built changed_rebuilt = Build(if_changed);
  REQUIRE(changed_rebuilt.status.ToString() == "OK");
  CHECK(changed_rebuilt.result.written == 298);
  CHECK_THAT(changed_rebuilt.log, Catch::Contains("--rebuild-if-changed"));
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
  CHECK(r->size() == 298);
}

TEST_CASE("options the recipe could not read back are refused before anything is written",
          "[build]") {
  // build.json must read back through Preprocessing::FromJson, which takes
  // geometry >= 0 and max_pixels >= 1 only: a resumed build would find it
  // unreadable otherwise.
  TempDir out;
  ingest::BuildOptions o = BuildOf(kFashion, out.path());
  o.channels = 1;
  std::vector<ingest::BuildOptions> refused_options(5, o);
  refused_options[0].resize = -1;
  refused_options[1].crop = -1;
  refused_options[2].size_w = refused_options[2].size_h = -28;
  refused_options[3].max_pixels = 0;
  refused_options[4].max_pixels = -5;
  for (size_t which = 0; which < refused_options.size(); ++which) {
    const ingest::BuildOptions& bad = refused_options[which];
    const Built refused = Build(bad);
    INFO(which << ": " << refused.status.ToString());
    CHECK(refused.status.IsInvalidArgument());
    CHECK(fs::is_empty(out.path()));
  }
}

// The build that is killed runs in a process of its own: the kiln command.
TEST_CASE("a build killed with SIGKILL resumes to identical shards", "[build]") {
  TempDir src, ref, out;
  MakePhotoFolder(src.path(), 60);  // 420 JPEGs
  // 37.7 KB records: a 4 MiB commit is ~111 of them, a 12 MB shard ~318,
  // so the shard being written when the kill lands already holds commits.
  ingest::BuildOptions o = BuildOf(src.path(), ref.path());
  o.resize = 64;
  o.crop = 56;
  o.dtype = DType::kFloat32;
  o.threads = 1;
  o.shard_size = 12u << 20;
  const std::string flags =
      " --resize 64 --crop 56 --dtype float32 --threads 1 "
      "--shard-size 12M --progress none";
  REQUIRE(Build(o).status.ToString() == "OK");
  o.out = out.path();
  bool resumed = false;
  for (int attempt = 0; attempt < 5 && !resumed; ++attempt) {
    fs::remove_all(out.path());
    fs::create_directories(out.path());
    pid_t pid = fork();
    if (pid == 0) {
      const std::string c = std::string(KILN_BIN) + " build " + src.path() + " " + out.path() +
                            flags + " >/dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", c.c_str(), (char*)nullptr);
      _exit(127);
    }
    // Kill once the first shard holds two commits (records of 10 pages:
    // 4.5 MB a commit) and before its third.
    auto size = [&] {
      std::error_code ec;
      const auto n = fs::file_size(out / "shard-00000.mdb", ec);
      return ec ? 0 : n;
    };
    for (int i = 0; i < 8000 && size() < (6u << 20) + 300000u * attempt; ++i) usleep(500);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    kill(0, 0);
    // sh -c may have forked kiln as a child: make sure it is gone too.
    std::string ignored;
    RunCommand("pkill -9 -f 'build " + src.path() + " " + out.path() + "'", &ignored);
    usleep(50000);
    if (fs::exists(out / "manifest.json")) continue;  // finished before the kill
    const Built b = Build(o);
    REQUIRE(b.status.ToString() == "OK");
    resumed = b.result.resumed;
    if (resumed) CHECK_THAT(b.log, Catch::Contains("resuming"));
  }
  REQUIRE(resumed);
  CHECK(CacheFiles(out.path()) == CacheFiles(ref.path()));
  CHECK(Problems(out.path()) == "");
}

TEST_CASE("bad inputs are skipped and listed, strict fails naming the first", "[build]") {
  TempDir src, out, strict_out;
  fs::create_directories(src / "a");
  fs::create_directories(src / "b");
  fs::copy_file(kPhotos + "/chelsea.jpg", src / "a/good.jpg");
  fs::copy_file(kPhotos + "/coffee.jpg", src / "b/good.jpg");
  const std::string jpeg = ReadFile(kPhotos + "/rocket.jpg");
  WriteFile(src / "a/truncated.jpg", jpeg.substr(0, jpeg.size() / 2));
  WriteFile(src / "a/empty.png", "");
  WriteFile(src / "b/text.jpg", "this is not an image\n");
  std::string corrupt = jpeg;
  for (size_t i = 600; i < corrupt.size(); i += 7) corrupt[i] = static_cast<char>(i);
  WriteFile(src / "b/corrupt.jpg", corrupt);
  fs::copy_file(kPhotos + "/hubble_deep_field.jpg", src / "b/huge.jpg");
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.resize = 64;
  o.crop = 64;
  o.max_pixels = 500000;  // hubble is 1000x872 = 872000 pixels: over the limit
  const Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.written == 2);
  CHECK(b.result.rejected == 5);
  CHECK_THAT(b.result.first_reject, Catch::Contains("a/empty.png"));
  const std::string tsv = ReadFile(out / "rejects.tsv");
  for (const char* f :
       {"a/truncated.jpg", "a/empty.png", "b/text.jpg", "b/corrupt.jpg", "b/huge.jpg"})
    CHECK_THAT(tsv, Catch::Contains(f));
  CHECK_THAT(tsv, Catch::Contains("max-pixels"));
  CHECK(Problems(out.path()) == "");
  ingest::BuildOptions strict = o;
  strict.out = strict_out.path();
  strict.strict = true;
  const Built failed = Build(strict);
  CHECK(failed.status.IsCorruption());
  CHECK_THAT(failed.status.message(),
             Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK_FALSE(fs::exists(strict_out / "manifest.json"));
  // Running it again resumes the failed build: --strict still fails on it.
  const Built resumed = Build(strict);
  CHECK(resumed.status.IsCorruption());
  CHECK_THAT(resumed.status.message(),
             Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK_FALSE(fs::exists(strict_out / "manifest.json"));
  // A finished cache with rejects does not pass --strict as "up to date".
  o.strict = true;
  const Built finished = Build(o);
  CHECK(finished.status.IsCorruption());
  CHECK_THAT(finished.status.message(),
             Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK(Problems(out.path()) == "");  // and it stays as it was
}

TEST_CASE(
    "a forced rebuild discards only under the directory lock, and a damaged unfinished build says "
    "--force",
    "[build]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 2);
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.resize = 32;
  REQUIRE(Build(o).status.ToString() == "OK");
  const auto before = CacheFiles(out.path());
  {
    // Another build holds the directory: --force is refused and deletes nothing.
    const int fd = ::open((out / ".kiln.lock").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    ingest::BuildOptions forced = o;
    forced.dtype = DType::kFloat32;
    forced.force = true;
    const Built refused = Build(forced);
    CHECK(refused.status.IsIOError());
    CHECK_THAT(refused.status.message(), Catch::Contains("in use"));
    ::close(fd);
  }
  CHECK(CacheFiles(out.path()) == before);
  CHECK(Problems(out.path()) == "");

  // An unfinished build (a --strict failure at its last input leaves one)
  // with unreadable recorded options: it says so and points at --force.
  TempDir unfinished;
  WriteFile(src / "dogs/zzz_bad.jpg", "not a jpeg");
  ingest::BuildOptions u = BuildOf(src.path(), unfinished.path());
  u.resize = 32;
  u.strict = true;
  REQUIRE(Build(u).status.IsCorruption());
  u.strict = false;
  REQUIRE(fs::exists(unfinished / "build.json"));
  REQUIRE_FALSE(fs::exists(unfinished / "manifest.json"));
  const std::string state = ReadFile(unfinished / "build.json");
  WriteFile(unfinished / "build.json", "");  // as a kill during a non-atomic write left it
  const Built unreadable = Build(u);
  CHECK(unreadable.status.IsStale());
  CHECK_THAT(unreadable.status.message(),
             Catch::Contains("unreadable") && Catch::Contains("--force"));
  // Readable again, but its shard cut short: a message, not SIGBUS.
  WriteFile(unfinished / "build.json", state);
  const std::string shard = ReadFile(unfinished / "shard-00000.mdb");
  WriteFile(unfinished / "shard-00000.mdb", shard.substr(0, shard.size() / 2));
  const Built truncated = Build(u);
  CHECK(truncated.status.IsCorruption());
  CHECK_THAT(truncated.status.message(),
             Catch::Contains("truncated") && Catch::Contains("--force"));
  u.force = true;
  const Built fresh = Build(u);
  REQUIRE(fresh.status.ToString() == "OK");
  CHECK_THAT(fresh.log, Catch::Contains("rebuilding from scratch (--force)"));
  CHECK(Problems(unfinished.path()) == "");
}

TEST_CASE("a list file builds the listed files", "[build]") {
  TempDir out;
  WriteFile(out / "list.txt", "photos/chelsea.jpg 1\nphotos/coffee.jpg 0\n");
  ingest::BuildOptions o = BuildOf(KILN_SAMPLE_DATA, out / "c");
  o.list_file = out / "list.txt";
  o.size_w = 32;
  o.size_h = 24;
  o.dtype = DType::kUint8;
  REQUIRE(Build(o).status.ToString() == "OK");
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(out / "c", ReaderOptions(), &r).ok());
  CHECK(r->manifest().shape.ToString() == "3x24x32");
  RecordView v;
  auto txn = r->BeginRead();
  REQUIRE(txn->Get(0, &v).ok());
  CHECK(v.label == 1);  // records in sorted path order: chelsea first
}

TEST_CASE("val-fraction splits deterministically by path", "[build]") {
  TempDir out;
  ingest::BuildOptions o = BuildOf(kFashion, out.path());
  o.channels = 1;
  o.val_fraction = 0.2;
  const Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.caches == std::vector<std::string>{out / "train", out / "val"});
  std::unique_ptr<CacheReader> tr, va;
  REQUIRE(CacheReader::Open(out / "train", ReaderOptions(), &tr).ok());
  REQUIRE(CacheReader::Open(out / "val", ReaderOptions(), &va).ok());
  CHECK(tr->size() + va->size() == 300);
  CHECK(va->size() > 30);
  CHECK(va->size() < 90);
  CHECK(Problems(out / "train") == "");
  CHECK(Problems(out / "val") == "");
  // `kiln verify OUT`, which checks both splits, is tested in tests/tools.
}

TEST_CASE("verify sources and deep levels against the build's sources", "[build][verify]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 2);
  const std::string cache = out / "c";
  ingest::BuildOptions o = BuildOf(src.path(), cache);
  o.resize = 40;
  o.crop = 32;
  REQUIRE(Build(o).status.ToString() == "OK");
  CHECK(Problems(cache, VerifyLevel::kQuick) == "");
  CHECK(Problems(cache, VerifyLevel::kFull) == "");
  CHECK(SourceProblems(cache, ingest::SourceCheck::kSources) == "");
  CHECK(SourceProblems(cache, ingest::SourceCheck::kDeep) == "");
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(src.path(), &list).ok());
  const std::string victim = list.root + "/" + list.items[3].rel_path;
  SECTION("a source modified after the build: stale at level sources") {
    std::string bytes = ReadFile(victim);
    WriteFile(victim, bytes + "x");
    CHECK(Problems(cache, VerifyLevel::kFull) == "");
    CHECK_THAT(
        SourceProblems(cache, ingest::SourceCheck::kSources),
        Catch::Contains("record 3 (" + list.items[3].rel_path + ")") && Catch::Contains("changed"));
    fs::copy_file(kPhotos + "/chelsea.jpg", src / "cats/new.jpg");
    CHECK_THAT(SourceProblems(cache, ingest::SourceCheck::kSources),
               Catch::Contains("(cats/new.jpg)") && Catch::Contains("added"));
  }
  SECTION("same size and mtime, other pixels: only deep finds it") {
    struct stat st;
    REQUIRE(stat(victim.c_str(), &st) == 0);
    std::string bytes = ReadFile(victim);
    for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 40; ++i)
      bytes[i] = static_cast<char>(bytes[i] ^ 0x55);
    WriteFile(victim, bytes);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    REQUIRE(utimensat(AT_FDCWD, victim.c_str(), times, 0) == 0);
    CHECK(SourceProblems(cache, ingest::SourceCheck::kSources) == "");
    CHECK_THAT(SourceProblems(cache, ingest::SourceCheck::kDeep),
               Catch::Contains("record 3 (" + list.items[3].rel_path + ")"));
  }
}

TEST_CASE("repair rewrites only the bad records and matches a fresh build", "[build][verify]") {
  TempDir src, out, ref;
  MakePhotoFolder(src.path(), 3);
  ingest::BuildOptions o = BuildOf(src.path(), out.path());
  o.resize = 40;
  o.crop = 32;
  o.dtype = DType::kFloat32;
  o.shard_size = 40 << 10;
  REQUIRE(Build(o).status.ToString() == "OK");
  ingest::BuildOptions fresh_build = o;
  fresh_build.out = ref.path();
  REQUIRE(Build(fresh_build).status.ToString() == "OK");
  // Damage records 2 and 17 (two different shards) in place.
  for (uint64_t idx : {2ull, 17ull}) {
    std::string head;
    std::string shard;
    {
      std::unique_ptr<CacheReader> r;
      REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
      RecordView v;
      REQUIRE(r->BeginRead()->Get(idx, &v).ok());
      head.assign(reinterpret_cast<const char*>(v.data) + 100, 64);
      shard = r->manifest().shards[r->manifest().ShardFor(idx)].file;
    }
    std::string bytes = ReadFile(out / shard);
    const size_t at = bytes.find(head);
    REQUIRE(at != std::string::npos);
    bytes[at + 5] ^= 0x40;
    WriteFile(out / shard, bytes);
  }
  VerifyReport damaged;
  REQUIRE(VerifyCache(out.path(), VerifyOptions(), &damaged).ok());
  CHECK_FALSE(damaged.clean());
  const auto before = CacheFiles(out.path());
  ingest::BuildOptions other = o;
  other.crop = 30;
  other.repair = true;
  const Built refused = Build(other);
  CHECK(refused.status.IsInvalidArgument());
  CHECK_THAT(refused.status.message(), Catch::Contains("original build"));
  o.repair = true;
  const Built repaired = Build(o);
  REQUIRE(repaired.status.ToString() == "OK");
  // (The photos repeat, so the bytes searched for may hit an earlier copy.)
  CHECK_THAT(repaired.log, Catch::Contains("repaired 2 record(s)"));
  CHECK(repaired.result.written == 2);
  CHECK(Problems(out.path()) == "");
  const auto after = CacheFiles(out.path());
  const auto fresh = CacheFiles(ref.path());
  for (const auto& [name, data] : fresh) {
    INFO(name);
    CHECK(after.at(name) == data);
  }
  // Shards holding no bad record were not rewritten.
  int untouched = 0;
  for (const auto& [name, data] : before)
    if (name != "manifest.json" && after.at(name) == data) ++untouched;
  CHECK(untouched == static_cast<int>(before.size()) - 3);
}
