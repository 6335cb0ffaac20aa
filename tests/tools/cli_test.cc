// The kiln command's contract on caches: exit codes (0 ok, 1 bad data, 2
// usage or environment) and messages that name the record, shard or file,
// for the damage that core's corruption tests make through the library.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>

#include "core/units.h"
#include "page_damage.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
const Shape kShape = MakeShape({3, 16, 16});
constexpr uint64_t kRecordBytes = 3 * 16 * 16 * 2;

// 60 float16 records, 20 per shard.
void MakeCache(const TempDir& dir) {
  WriteTestCache(dir.path(), 60, DType::kFloat16, kShape, 10, kRecordBytes * 20);
}

int Kiln(const std::string& args, std::string* out) {
  return RunCommand(std::string(KILN_BIN) + " " + args, out);
}
}  // namespace

TEST_CASE("a clean cache: verify and inspect exit 0, inspect summarizes it", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  std::string out;
  CHECK(Kiln("verify " + dir.path(), &out) == 0);
  CHECK(Kiln("inspect " + dir.path(), &out) == 0);
  CHECK_THAT(out, Catch::Contains("records:       60"));
  CHECK_THAT(out, Catch::Contains("float16 3x16x16"));
  CHECK_THAT(out, Catch::Contains("3 shards"));
  CHECK_THAT(out, Catch::Contains("0=class0"));
}

TEST_CASE("a flipped payload byte: verify exits 1 naming the record", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  const std::string shard = dir / "shard-00001.mdb";
  FlipByte(shard, PayloadOffset(ReadFile(shard), 25, DType::kFloat16, kRecordBytes) + 100);
  std::string out;
  CHECK(Kiln("verify " + dir.path(), &out) == 1);
  CHECK_THAT(out, Catch::Contains("record 25"));
}

TEST_CASE("damaged shards and manifests: exit 1 naming what is wrong", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  std::string out;
  SECTION("a truncated shard") {
    REQUIRE(truncate((dir / "shard-00001.mdb").c_str(), 20000) == 0);
    CHECK(Kiln("inspect " + dir.path(), &out) == 1);
    CHECK_THAT(out, Catch::Contains("shard-00001.mdb") && Catch::Contains("truncated"));
  }
  SECTION("a missing shard") {
    std::filesystem::remove(dir / "shard-00002.mdb");
    CHECK(Kiln("inspect " + dir.path(), &out) == 1);
    CHECK_THAT(out, Catch::Contains("shard-00002.mdb") && Catch::Contains("missing"));
  }
  std::string m = ReadFile(dir / "manifest.json");
  SECTION("the manifest's count edited") {
    m.replace(m.find("\"count\": 60"), 11, "\"count\": 61");
    WriteFile(dir / "manifest.json", m);
    CHECK(Kiln("inspect " + dir.path(), &out) == 1);
  }
  SECTION("class names edited") {
    m.replace(m.find("\"class0\""), 8, "\"classX\"");
    WriteFile(dir / "manifest.json", m);
    CHECK(Kiln("verify " + dir.path() + " --level quick", &out) == 1);
    CHECK_THAT(out, Catch::Contains("meta_digest"));
  }
  SECTION("a manifest that is not JSON") {
    WriteFile(dir / "manifest.json", m.substr(0, m.size() / 2));
    CHECK(Kiln("inspect " + dir.path(), &out) == 1);
  }
  SECTION("no manifest: an incomplete cache") {
    std::filesystem::remove(dir / "manifest.json");
    CHECK(Kiln("verify " + dir.path(), &out) == 1);
    CHECK(Kiln("inspect " + dir.path(), &out) == 1);
    CHECK_THAT(out, Catch::Contains("incomplete"));
  }
  SECTION("no such directory is a usage error") {
    CHECK(Kiln("verify " + dir.path() + "/nope", &out) == 2);
    CHECK(Kiln("inspect " + dir.path() + "/nope", &out) == 2);
  }
}

TEST_CASE("kiln bench reports the loader against its memcpy floor", "[cli]") {
  TempDir dir;
  WriteTestCache(dir.path(), 64, DType::kFloat16, MakeShape({3, 16, 16}));
  std::string out;
  REQUIRE(Kiln("bench " + dir.path() + " --batch 16 --epochs 1", &out) == 0);
  CHECK_THAT(out, Catch::Contains("epoch 0:") && Catch::Contains("loader / floor = ") &&
                      Catch::Contains("RssAnon"));
  // Other devices are measured by kiln-train (tests/train).
}

TEST_CASE("kiln bench on 300 seeded header-damaged shards: exit 1 naming the shard, no signal",
          "[cli]") {
  // The sample cache's shape: 300 float16 1x28x28 records, two to a leaf
  // page. With only the meta pages checked at open, 2 of 150 such tries
  // died by signal inside LMDB.
  TempDir dir;
  WriteTestCache(dir / "c", 300, DType::kFloat16, MakeShape({1, 28, 28}));
  const std::string shard = dir / "c/shard-00000.mdb", good = ReadFile(shard);
  int refused = 0;
  for (int seed = 1; seed <= 300; ++seed) {
    std::string bytes = good;
    const uint64_t page = DamagePageHeader(&bytes, seed);
    WriteFile(shard, bytes);
    std::string out;
    const int status = Kiln("bench " + dir / "c", &out);  // the defaults
    INFO("seed " << seed << ", page " << page << ": exit " << status << "\n" << out);
    REQUIRE((status == 0 || status == 1));  // 1 is bad data; a signal is neither
    if (status == 1) {
      ++refused;
      CHECK_THAT(out, Catch::Contains(shard));
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("kiln doctor: the machine's checklist, exit 0, without a CUDA driver it says so",
          "[cli]") {
  std::string out;
  REQUIRE(Kiln("doctor", &out) == 0);
  CHECK_THAT(out, Catch::Contains("cpu: ") && Catch::Contains("usable core") &&
                      Catch::Contains("memory: ") && Catch::Contains("libraries: LMDB "));
  // This machine's own GPU, or its absence.
  CHECK_THAT(out, Catch::Contains("gpu 0: ") || Catch::Contains("gpu: no GPU found"));
  REQUIRE(Kiln("doctor --cuda-library /nonexistent/libcuda.so.1", &out) == 0);
  CHECK_THAT(out, Catch::Contains("warn  gpu: no GPU found: kiln train will run on the CPU; "));
  CHECK_THAT(out, Catch::Contains("info  pinned memory: not applicable without a GPU."));
  CHECK_THAT(out, Catch::Contains("kiln doctor: 5 checks, "));
}

TEST_CASE("kiln doctor CACHE: its size and filesystem, a missing or damaged cache fails", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().extension() == ".mdb") bytes += e.file_size();
  const std::string no_gpu = " --cuda-library /nonexistent/libcuda.so.1";
  std::string out;
  REQUIRE(Kiln("doctor " + dir.path() + no_gpu, &out) == 0);
  CHECK_THAT(out, Catch::Contains("filesystem: " + dir.path() + " is on "));
  CHECK_THAT(out, Catch::Contains("cache size: " + FormatByteSize(static_cast<double>(bytes)) +
                                  " (60 records of "));
  CHECK_THAT(out, Catch::Contains("ok    cache verify: verify --level quick: clean, 60 records"));

  CHECK(Kiln("doctor " + dir.path() + "/nope" + no_gpu, &out) == 2);
  CHECK_THAT(out, Catch::Contains("kiln doctor: ") &&
                      Catch::Contains(dir.path() + "/nope: no such cache directory"));

  std::filesystem::remove(dir / "shard-00002.mdb");
  CHECK(Kiln("doctor " + dir.path() + no_gpu, &out) == 1);
  CHECK_THAT(
      out, Catch::Contains("warn  cache: cannot be opened") && Catch::Contains("shard-00002.mdb"));
}

TEST_CASE("kiln inspect counts records per class and flags classes under 1% of the mean", "[cli]") {
  // 900 records: classes 0 and 1 have 400 each, class 2 has 98, class 3 two
  // (the mean is 225, 1% of it 2.25).
  TempDir dir;
  WriterOptions o;
  o.dtype = DType::kUint8;
  o.shape = MakeShape({1, 2, 2});
  std::unique_ptr<CacheWriter> w;
  REQUIRE(CacheWriter::Open(o, dir.path(), &w).ok());
  const uint8_t payload[4] = {1, 2, 3, 4};
  for (uint64_t i = 0; i < 900; ++i) {
    const int64_t label = i < 400 ? 0 : i < 800 ? 1 : i < 898 ? 2 : 3;
    REQUIRE(w->Append(i, label, payload).ok());
  }
  Manifest m;
  m.classes = {"cat", "dog", "fox", "yak"};
  REQUIRE(w->Finish(&m).ok());
  std::string out;
  REQUIRE(Kiln("inspect " + dir.path(), &out) == 0);
  CHECK_THAT(out, Catch::Contains("class counts:  mean 225.0, smallest 2 (3), largest 400 (0)\n"));
  CHECK_THAT(out, Catch::Contains("  0=cat  400\n  1=dog  400\n  2=fox  98\n"
                                  "  3=yak  2  * under 1% of the mean\n"));
  CHECK_THAT(out, Catch::Contains("1 class under 1% of the mean count (*)"));
}

TEST_CASE("a mistyped option: exit 2 with the nearest option names", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  std::string out;
  CHECK(Kiln("verify " + dir.path() + " --levle quick", &out) == 2);
  CHECK_THAT(out, Catch::Contains("kiln verify: unknown option --levle; did you mean --level?"));
  CHECK(Kiln("inspect " + dir.path() + " --JSON", &out) == 2);
  CHECK_THAT(out, Catch::Contains("unknown option --JSON; did you mean --json?"));
  CHECK(Kiln("inspect " + dir.path() + " --frobnicate", &out) == 2);
  CHECK_THAT(out, Catch::Contains("unknown option --frobnicate"));
  CHECK_THAT(out, !Catch::Contains("did you mean"));
  CHECK(Kiln("--verison", &out) == 2);
  CHECK_THAT(out, Catch::Contains("kiln: unknown option --verison; did you mean --version?"));
}

TEST_CASE("an unknown subcommand: exit 2 with the nearest subcommand", "[cli]") {
  TempDir dir;
  MakeCache(dir);
  std::string out;
  CHECK(Kiln("verfy " + dir.path(), &out) == 2);
  CHECK_THAT(out, Catch::Contains("kiln: unknown subcommand 'verfy'; did you mean verify?"));
  CHECK(Kiln("frobnicate " + dir.path(), &out) == 2);
  CHECK_THAT(out, Catch::Contains("unknown subcommand 'frobnicate'; the subcommands are ") &&
                      Catch::Contains("inspect"));
}

TEST_CASE("every subcommand's --help ends with examples of it", "[cli]") {
  std::string out;
  REQUIRE(Kiln("--help", &out) == 0);
  const size_t list = out.find("Subcommands:");
  REQUIRE(list != std::string::npos);
  std::vector<std::string> names;
  std::istringstream lines(out.substr(list));
  std::string line;
  std::getline(lines, line);  // "Subcommands:"
  while (std::getline(lines, line) && line.size() > 2 && line[0] == ' ') {
    const size_t begin = line.find_first_not_of(' ');
    names.push_back(line.substr(begin, line.find(' ', begin) - begin));
  }
  CHECK(names.size() >= 3);  // verify, inspect and bench are always built
  for (const std::string& name : names) {
    CAPTURE(name);
    REQUIRE(Kiln(name + " --help", &out) == 0);
    CHECK_THAT(out, Catch::Contains("Examples:\n  kiln " + name + " "));
  }
}
