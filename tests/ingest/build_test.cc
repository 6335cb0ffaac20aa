#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include "kiln/ingest/build.h"
#include "kiln/cache_reader.h"
#include "kiln/manifest.h"
#include "kiln/image/decode.h"
#include "kiln/verify.h"
#include "ingest_test_util.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {


// Every shard file and the manifest of a cache, by name.
std::map<std::string, std::string> CacheFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.rfind("shard-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".mdb") == 0;
    if (shard || n == "manifest.json") files[n] = ReadFile(e.path().string());
  }
  return files;
}

double HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double s = (h & 0x8000) ? -1 : 1;
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1024 + m, e - 25);
}
}  // namespace

TEST_CASE("kiln build of the Fashion-MNIST sample: labels, shape, pixels", "[build]") {
  TempDir out;
  std::string log;
  REQUIRE(Kiln("build " + kFashion + " " + out.path() +
                   " --channels 1 --dtype float16 --mean 0.5 --std 0.25 --progress none",
               &log) == 0);
  CHECK_THAT(log, Catch::Contains("300 written, 0 rejected"));
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
    image::DecodeOptions o;
    o.channels = 1;
    REQUIRE(image::Decode(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "png", o, &img).ok());
    const uint16_t* h = reinterpret_cast<const uint16_t*>(v.data);
    for (int p = 0; p < 28 * 28; p += 37) {
      const double want = (img.pixels[p] / 255.0 - 0.5) / 0.25;
      REQUIRE(std::abs(HalfToFloat(h[p]) - want) <= 2e-3);
    }
  }
  CHECK(Kiln("verify " + out.path(), &log) == 0);
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

TEST_CASE("the same build again is up to date, changed sources need force", "[build]") {
  TempDir src, out;
  fs::copy(kFashion, src.path(), fs::copy_options::recursive);
  const std::string cmd = "build " + src.path() + " " + out.path() + " --channels 1 --progress none";
  std::string log;
  REQUIRE(Kiln(cmd, &log) == 0);
  const auto before = CacheFiles(out.path());
  REQUIRE(Kiln(cmd, &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date"));
  CHECK(CacheFiles(out.path()) == before);
  // Options changed.
  CHECK(Kiln(cmd + " --dtype float32", &log) == 1);
  CHECK_THAT(log, Catch::Contains("dtype") && Catch::Contains("--force"));
  CHECK(CacheFiles(out.path()) == before);  // nothing lost
  // A source changed.
  fs::remove(src / "3_dress/00003.png");
  const std::string first = fs::directory_iterator(src / "3_dress")->path().string();
  fs::remove(first);
  CHECK(Kiln(cmd, &log) == 1);
  CHECK_THAT(log, Catch::Contains("source"));
  REQUIRE(Kiln(cmd + " --force", &log) == 0);
  std::unique_ptr<CacheReader> r;
  REQUIRE(CacheReader::Open(out.path(), ReaderOptions(), &r).ok());
  CHECK(r->size() == 298);
}

TEST_CASE("a build killed with SIGKILL resumes to identical shards", "[build]") {
  TempDir src, ref, out;
  MakePhotoFolder(src.path(), 60);  // 420 JPEGs
  // 37.7 KB records: a 4 MiB commit is ~111 of them, a 12 MB shard ~318,
  // so the shard being written when the kill lands already holds commits.
  const std::string args = src.path() + " %s --resize 64 --crop 56 --dtype float32 --threads 1 "
                           "--shard-size 12M --progress none";
  auto cmd = [&](const std::string& dir) {
    char buf[1024];
    std::snprintf(buf, sizeof(buf), args.c_str(), dir.c_str());
    return std::string(buf);
  };
  std::string log;
  REQUIRE(Kiln("build " + cmd(ref.path()), &log) == 0);
  bool resumed = false;
  for (int attempt = 0; attempt < 5 && !resumed; ++attempt) {
    fs::remove_all(out.path());
    fs::create_directories(out.path());
    pid_t pid = fork();
    if (pid == 0) {
      const std::string c = cmd(out.path());
      execl("/bin/sh", "sh", "-c", (std::string(KILN_BIN) + " build " + c + " >/dev/null 2>&1").c_str(),
            (char*)nullptr);
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
    REQUIRE(Kiln("build " + cmd(out.path()), &log) == 0);
    resumed = log.find("resuming") != std::string::npos;
  }
  REQUIRE(resumed);
  CHECK(CacheFiles(out.path()) == CacheFiles(ref.path()));
  VerifyReport rep;
  REQUIRE(VerifyCache(out.path(), VerifyOptions(), &rep).ok());
  CHECK(rep.clean());
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
  std::string log;
  // hubble is 1000x872 = 872000 pixels: over the limit below.
  const std::string opts = " --resize 64 --crop 64 --max-pixels 500000 --progress none";
  REQUIRE(Kiln("build " + src.path() + " " + out.path() + opts, &log) == 0);
  CHECK_THAT(log, Catch::Contains("2 written, 5 rejected"));
  const std::string tsv = ReadFile(out / "rejects.tsv");
  for (const char* f : {"a/truncated.jpg", "a/empty.png", "b/text.jpg", "b/corrupt.jpg", "b/huge.jpg"})
    CHECK_THAT(tsv, Catch::Contains(f));
  CHECK_THAT(tsv, Catch::Contains("max-pixels"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);
  CHECK(Kiln("build " + src.path() + " " + strict_out.path() + opts + " --strict", &log) == 1);
  CHECK_THAT(log, Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK_FALSE(fs::exists(strict_out / "manifest.json"));
  // Running it again resumes the failed build: --strict still fails on it.
  CHECK(Kiln("build " + src.path() + " " + strict_out.path() + opts + " --strict", &log) == 1);
  CHECK_THAT(log, Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK_FALSE(fs::exists(strict_out / "manifest.json"));
  // A finished cache with rejects does not pass --strict as "up to date".
  CHECK(Kiln("build " + src.path() + " " + out.path() + opts + " --strict", &log) == 1);
  CHECK_THAT(log, Catch::Contains("a/empty.png") && Catch::Contains("--strict"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);  // and it stays as it was
}

TEST_CASE("a forced rebuild discards only under the directory lock; a damaged unfinished build says --force",
          "[build]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 2);
  const std::string cmd = "build " + src.path() + " " + out.path() + " --resize 32 --progress none";
  std::string log;
  REQUIRE(Kiln(cmd, &log) == 0);
  const auto before = CacheFiles(out.path());
  {
    // Another build holds the directory: --force is refused and deletes nothing.
    const int fd = ::open((out / ".kiln.lock").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK(Kiln(cmd + " --dtype float32 --force", &log) == 2);
    CHECK_THAT(log, Catch::Contains("in use"));
    ::close(fd);
  }
  CHECK(CacheFiles(out.path()) == before);
  CHECK(Kiln("verify " + out.path(), &log) == 0);

  // An unfinished build (a --strict failure at its last input leaves one)
  // with unreadable recorded options: it says so and points at --force.
  TempDir unfinished;
  WriteFile(src / "dogs/zzz_bad.jpg", "not a jpeg");
  const std::string cmd2 = "build " + src.path() + " " + unfinished.path() + " --resize 32 --progress none";
  REQUIRE(Kiln(cmd2 + " --strict", &log) == 1);
  REQUIRE(fs::exists(unfinished / "build.json"));
  REQUIRE_FALSE(fs::exists(unfinished / "manifest.json"));
  const std::string state = ReadFile(unfinished / "build.json");
  WriteFile(unfinished / "build.json", "");  // as a kill during a non-atomic write left it
  CHECK(Kiln(cmd2, &log) == 1);
  CHECK_THAT(log, Catch::Contains("unreadable") && Catch::Contains("--force"));
  // Readable again, but its shard cut short: a message, not SIGBUS.
  WriteFile(unfinished / "build.json", state);
  const std::string shard = ReadFile(unfinished / "shard-00000.mdb");
  WriteFile(unfinished / "shard-00000.mdb", shard.substr(0, shard.size() / 2));
  CHECK(Kiln(cmd2, &log) == 1);
  CHECK_THAT(log, Catch::Contains("truncated") && Catch::Contains("--force"));
  REQUIRE(Kiln(cmd2 + " --force", &log) == 0);
  CHECK_THAT(log, Catch::Contains("starting over"));
  CHECK(Kiln("verify " + unfinished.path(), &log) == 0);
}

TEST_CASE("kiln build --list builds the listed files", "[build]") {
  TempDir out;
  const std::string root = KILN_SAMPLE_DATA;
  SECTION("list file with numeric labels") {
    WriteFile(out / "list.txt", "photos/chelsea.jpg 1\nphotos/coffee.jpg 0\n");
    std::string log;
    REQUIRE(Kiln("build " + root + " " + (out / "c") + " --list " + (out / "list.txt") +
                     " --size 32x24 --dtype uint8 --progress none",
                 &log) == 0);
    std::unique_ptr<CacheReader> r;
    REQUIRE(CacheReader::Open(out / "c", ReaderOptions(), &r).ok());
    CHECK(r->manifest().shape.ToString() == "3x24x32");
    RecordView v;
    auto txn = r->BeginRead();
    REQUIRE(txn->Get(0, &v).ok());
    CHECK(v.label == 1);  // records in sorted path order: chelsea first
  }
}

TEST_CASE("val-fraction splits deterministically by path", "[build]") {
  TempDir out;
  ingest::BuildOptions o;
  o.src = kFashion;
  o.out = out.path();
  o.channels = 1;
  o.val_fraction = 0.2;
  ingest::BuildResult r;
  REQUIRE(ingest::BuildCache(o, nullptr, nullptr, &r).ok());
  std::unique_ptr<CacheReader> tr, va;
  REQUIRE(CacheReader::Open(out / "train", ReaderOptions(), &tr).ok());
  REQUIRE(CacheReader::Open(out / "val", ReaderOptions(), &va).ok());
  CHECK(tr->size() + va->size() == 300);
  CHECK(va->size() > 30);
  CHECK(va->size() < 90);
  // `kiln verify OUT` checks both splits; a damaged one fails it.
  std::string log;
  CHECK(Kiln("verify " + out.path(), &log) == 0);
  CHECK_THAT(log, Catch::Contains(out / "train") && Catch::Contains(out / "val"));
  CHECK(Kiln("verify " + out.path() + " --json", &log) == 0);
  CHECK_THAT(log, Catch::Contains("\"splits\"") && Catch::Contains("\"val\""));
  fs::remove(out / "val/manifest.json");
  CHECK(Kiln("verify " + out.path(), &log) == 1);
  CHECK_THAT(log, Catch::Contains("incomplete"));
}

TEST_CASE("verify sources and deep levels against the build's sources", "[build][verify]") {
  TempDir src, out;
  MakePhotoFolder(src.path(), 2);
  const std::string cache = out / "c";
  std::string log;
  REQUIRE(Kiln("build " + src.path() + " " + cache + " --resize 40 --crop 32 --progress none", &log) == 0);
  for (const char* level : {"quick", "full", "sources", "deep"}) {
    INFO(level);
    CHECK(Kiln("verify " + cache + " --level " + level + " --sample 0", &log) == 0);
  }
  ingest::SourceList list;
  REQUIRE(ingest::ListImageFolder(src.path(), &list).ok());
  const std::string victim = list.root + "/" + list.items[3].rel_path;
  SECTION("a source modified after the build: stale at level sources") {
    std::string bytes = ReadFile(victim);
    WriteFile(victim, bytes + "x");
    CHECK(Kiln("verify " + cache + " --level full", &log) == 0);
    CHECK(Kiln("verify " + cache + " --level sources", &log) == 1);
    CHECK_THAT(log, Catch::Contains("record 3") && Catch::Contains(list.items[3].rel_path) &&
                        Catch::Contains("changed"));
    fs::copy_file(kPhotos + "/chelsea.jpg", src / "cats/new.jpg");
    CHECK(Kiln("verify " + cache + " --level sources --json", &log) == 1);
    CHECK_THAT(log, Catch::Contains("\"source\": \"cats/new.jpg\"") && Catch::Contains("added"));
  }
  SECTION("same size and mtime, other pixels: only deep finds it") {
    struct stat st;
    REQUIRE(stat(victim.c_str(), &st) == 0);
    std::string bytes = ReadFile(victim);
    for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 40; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x55);
    WriteFile(victim, bytes);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    REQUIRE(utimensat(AT_FDCWD, victim.c_str(), times, 0) == 0);
    CHECK(Kiln("verify " + cache + " --level sources", &log) == 0);
    CHECK(Kiln("verify " + cache + " --level deep --sample 0", &log) == 1);
    CHECK_THAT(log, Catch::Contains("record 3") && Catch::Contains(list.items[3].rel_path));
  }
}

TEST_CASE("repair rewrites only the bad records and matches a fresh build", "[build][verify]") {
  TempDir src, out, ref;
  MakePhotoFolder(src.path(), 3);
  const std::string opts = " --resize 40 --dtype float32 --shard-size 40K --progress none";
  std::string log;
  REQUIRE(Kiln("build " + src.path() + " " + out.path() + opts + " --crop 32", &log) == 0);
  REQUIRE(Kiln("build " + src.path() + " " + ref.path() + opts + " --crop 32", &log) == 0);
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
  CHECK(Kiln("verify " + out.path(), &log) == 1);
  const auto before = CacheFiles(out.path());
  CHECK(Kiln("build " + src.path() + " " + out.path() + opts + " --crop 30 --repair", &log) == 2);
  CHECK_THAT(log, Catch::Contains("original build"));
  REQUIRE(Kiln("build " + src.path() + " " + out.path() + opts + " --crop 32 --repair", &log) == 0);
  // (The photos repeat, so the bytes searched for may hit an earlier copy.)
  CHECK_THAT(log, Catch::Contains("repaired 2 record(s)"));
  CHECK(Kiln("verify " + out.path(), &log) == 0);
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
