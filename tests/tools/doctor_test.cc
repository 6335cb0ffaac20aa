// kiln doctor's probes (tools/doctor.h) with inputs the tests make: a fake
// CUDA driver (fake_cuda.cc, KILN_FAKE_CUDA), meminfo and cpu.max texts, and
// caches in temp directories.
#include "doctor.h"

#include <stdlib.h>
#include <sys/vfs.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "kiln/manifest.h"
#include "core/units.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::tools;

namespace {

const char* kNoDriver = "/nonexistent/libcuda.so.1";

const Finding* FindTopic(const std::vector<Finding>& findings, const std::string& topic) {
  for (const Finding& f : findings)
    if (f.topic == topic) return &f;
  return nullptr;
}

uint64_t ShardBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".mdb") bytes += e.file_size();
  return bytes;
}

MemInfo Ram(uint64_t total, uint64_t available) {
  MemInfo m;
  m.total = total;
  m.available = available;
  return m;
}

}  // namespace

TEST_CASE("no CUDA driver: no GPU found, train runs on the CPU, pinned memory not applicable",
          "[doctor]") {
  const GpuProbe g = ProbeGpus(kNoDriver, 1 << 20);
  CHECK(g.devices.empty());
  CHECK_FALSE(g.pinned_tried);
  CHECK_THAT(g.none_reason, Catch::Contains("no CUDA driver: ") && Catch::Contains(kNoDriver));
  const std::vector<Finding> f = GpuFindings(g, 1 << 20);
  REQUIRE(f.size() == 2);
  CHECK(f[0].level == FindingLevel::kWarn);
  CHECK(f[0].topic == "gpu");
  CHECK_THAT(f[0].text, Catch::StartsWith("no GPU found: kiln train will run on the CPU; "));
  CHECK(f[1].topic == "pinned memory");
  CHECK_THAT(f[1].text, Catch::Contains("not applicable"));
}

TEST_CASE("a CUDA driver: every device by name and memory, pinned memory allocated", "[doctor]") {
  ::setenv("KILN_FAKE_CUDA_DEVICES", "2", 1);
  GpuProbe g = ProbeGpus(KILN_FAKE_CUDA, 64 << 20);
  REQUIRE(g.devices.size() == 2);
  CHECK(g.devices[0].name == "Fake GPU Zero");
  CHECK(g.devices[1].name == "Fake GPU One");
  CHECK(g.devices[0].memory == (8ull << 30));
  CHECK(g.devices[1].memory == (16ull << 30));
  CHECK(g.driver_version == 12040);
  CHECK(g.pinned_tried);
  CHECK(g.pinned_error.empty());
  std::vector<Finding> f = GpuFindings(g, 64 << 20);
  REQUIRE(f.size() == 3);
  CHECK(FormatFinding(f[0]) ==
        "ok    gpu 0: Fake GPU Zero, 8.6 GB (CUDA driver 12.4): kiln train --device cuda:0 "
        "trains on it.");
  CHECK(f[1].topic == "gpu 1");
  CHECK(f[2].topic == "pinned memory");
  CHECK(f[2].level == FindingLevel::kOk);
  CHECK_THAT(f[2].text, Catch::StartsWith("67.1 MB of page-locked host memory allocated"));

  SECTION("a page-locked allocation the driver refuses is a warning that names the error") {
    g = ProbeGpus(KILN_FAKE_CUDA, 2ull << 30);
    CHECK(g.pinned_tried);
    CHECK_THAT(g.pinned_error, Catch::Contains("cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY"));
    f = GpuFindings(g, 2ull << 30);
    CHECK(f.back().level == FindingLevel::kWarn);
    CHECK_THAT(f.back().text, Catch::Contains("out of memory"));
  }
  SECTION("a driver without devices: cuInit's error, no GPU found") {
    ::setenv("KILN_FAKE_CUDA_DEVICES", "0", 1);
    g = ProbeGpus(KILN_FAKE_CUDA, 64 << 20);
    CHECK(g.devices.empty());
    CHECK_FALSE(g.pinned_tried);
    CHECK_THAT(g.none_reason, Catch::Contains("cuInit: CUDA_ERROR_NO_DEVICE"));
    CHECK_THAT(GpuFindings(g, 64 << 20)[0].text, Catch::StartsWith("no GPU found"));
  }
  ::unsetenv("KILN_FAKE_CUDA_DEVICES");
}

TEST_CASE("meminfo: MemTotal and MemAvailable, in bytes", "[doctor]") {
  MemInfo m;
  REQUIRE(ParseMemInfo("MemTotal:       16000000 kB\nMemFree:         1000 kB\n"
                       "MemAvailable:    8000000 kB\nBuffers: 12 kB\n",
                       &m)
              .ok());
  CHECK(m.total == 16000000ull * 1024);
  CHECK(m.available == 8000000ull * 1024);
  CHECK(MemoryFinding(m).level == FindingLevel::kOk);
  CHECK(ParseMemInfo("MemTotal: 100 kB\n", &m).IsCorruption());
  // Under a tenth available: a warning.
  CHECK(MemoryFinding(Ram(1000000, 99999)).level == FindingLevel::kWarn);
}

TEST_CASE("filesystems by their statfs magic", "[doctor]") {
  CHECK(FilesystemName(0xEF53) == "ext2/ext3/ext4");
  CHECK(FilesystemName(0x01021994) == "tmpfs");
  CHECK(FilesystemName(0x6969) == "nfs");
  CHECK(FilesystemName(0x1234) == "unknown (0x1234)");
  CHECK(IsNetworkFilesystem(0x6969));
  CHECK(IsNetworkFilesystem(0xFE534D42));
  CHECK_FALSE(IsNetworkFilesystem(0xEF53));
  CHECK_FALSE(IsNetworkFilesystem(0x1234));
}

TEST_CASE("cpus: usable and the threads kiln starts, a cgroup quota below them warns", "[doctor]") {
  TempDir dir;
  WriteFile(dir / "cpu.max", "max 100000\n");
  CpuFacts c = ProbeCpus(dir / "cpu.max");
  CHECK(c.usable >= 1);
  CHECK(c.online >= c.usable);
  CHECK(c.quota == 0);
  CHECK(c.pool_threads >= 1);
  CHECK_THAT(CpuFinding(c).text,
             Catch::Contains(std::to_string(c.usable) + " usable core") &&
                 Catch::Contains("kiln build and verify use " + std::to_string(c.pool_threads)));
  WriteFile(dir / "cpu.max", "150000 100000\n");
  CHECK(ProbeCpus(dir / "cpu.max").quota == Approx(1.5));
  CHECK(ProbeCpus(dir / "absent").quota == 0);

  CpuFacts eight;
  eight.usable = eight.online = eight.pool_threads = eight.train_threads = 8;
  CHECK(CpuFinding(eight).level == FindingLevel::kOk);
  CHECK_THAT(CpuFinding(eight).text,
             Catch::Contains("no native bf16: kiln train on the CPU trains in fp32"));
  eight.native_bf16 = true;
  CHECK_THAT(
      CpuFinding(eight).text,
      Catch::Contains("native bf16 (AVX512-BF16/AMX): kiln train on the CPU trains in bf16"));
  eight.quota = 2;
  const Finding f = CpuFinding(eight);
  CHECK(f.level == FindingLevel::kWarn);
  CHECK_THAT(f.text,
             Catch::Contains("quota allows only 2.0 CPUs") && Catch::Contains("--threads 2"));
}

TEST_CASE("a cache: its filesystem, its size against RAM, verify --level quick", "[doctor]") {
  TempDir dir;
  WriteTestCache(dir.path(), 60, DType::kFloat16, MakeShape({3, 16, 16}), 10, 20 * 3 * 16 * 16 * 2);
  const uint64_t bytes = ShardBytes(dir.path());
  REQUIRE(bytes > 0);
  struct statfs sfs;
  REQUIRE(::statfs(dir.path().c_str(), &sfs) == 0);

  std::vector<Finding> f;
  bool ok = false;
  REQUIRE(CacheFindings(dir.path(), Ram(bytes * 100, bytes * 10), &f, &ok).ok());
  CHECK(ok);
  const Finding* fs = FindTopic(f, "filesystem");
  REQUIRE(fs != nullptr);
  CHECK_THAT(fs->text, Catch::StartsWith(dir.path() + " is on " +
                                         FilesystemName(static_cast<int64_t>(sfs.f_type))));
  const Finding* size = FindTopic(f, "cache size");
  REQUIRE(size != nullptr);
  CHECK(size->level == FindingLevel::kOk);
  CHECK_THAT(size->text, Catch::StartsWith(FormatByteSize(static_cast<double>(bytes)) +
                                           " (60 records of 1.5 KB)") &&
                             Catch::Contains("fits in the"));
  const Finding* verify = FindTopic(f, "cache verify");
  REQUIRE(verify != nullptr);
  CHECK(verify->level == FindingLevel::kOk);
  CHECK_THAT(verify->text, Catch::Contains("clean, 60 records"));

  SECTION("larger than RAM, or than what is available: warnings") {
    f.clear();
    REQUIRE(CacheFindings(dir.path(), Ram(bytes / 2, bytes / 4), &f, &ok).ok());
    CHECK(FindTopic(f, "cache size")->level == FindingLevel::kWarn);
    CHECK_THAT(FindTopic(f, "cache size")->text, Catch::Contains("larger than RAM"));
    f.clear();
    REQUIRE(CacheFindings(dir.path(), Ram(bytes * 2, bytes / 2), &f, &ok).ok());
    CHECK_THAT(FindTopic(f, "cache size")->text, Catch::Contains("but not in the"));
  }
  SECTION("larger than the memory cgroup's limit: every epoch reads the disk") {
    MemInfo mem = Ram(bytes * 100, bytes * 10);
    mem.cgroup_limit = bytes / 3;
    f.clear();
    REQUIRE(CacheFindings(dir.path(), mem, &f, &ok).ok());
    CHECK(FindTopic(f, "cache size")->level == FindingLevel::kWarn);
    CHECK_THAT(FindTopic(f, "cache size")->text,
               Catch::Contains("larger than the memory cgroup's limit") &&
                   Catch::Contains("every epoch reads all") && Catch::Contains("--cold"));
  }
  SECTION("a damaged cache is a warning and not ok") {
    std::filesystem::remove(dir / "shard-00001.mdb");
    f.clear();
    REQUIRE(CacheFindings(dir.path(), Ram(bytes * 100, bytes * 10), &f, &ok).ok());
    CHECK_FALSE(ok);
    const Finding* c = FindTopic(f, "cache");
    REQUIRE(c != nullptr);
    CHECK(c->level == FindingLevel::kWarn);
    CHECK_THAT(c->text, Catch::Contains("shard-00001.mdb"));
  }
  SECTION("edited class names: verify --level quick fails") {
    std::string m = ReadFile(dir / "manifest.json");
    m.replace(m.find("\"class0\""), 8, "\"classX\"");
    WriteFile(dir / "manifest.json", m);
    f.clear();
    REQUIRE(CacheFindings(dir.path(), Ram(bytes * 100, bytes * 10), &f, &ok).ok());
    CHECK_FALSE(ok);
  }
}

TEST_CASE("RunDoctor: every check in order, a missing cache is NotFound", "[doctor]") {
  TempDir dir;
  WriteTestCache(dir.path(), 12, DType::kUint8, MakeShape({3, 4, 4}));
  DoctorOptions o;
  o.cache = dir.path();
  o.cuda_library = kNoDriver;
  std::vector<Finding> f;
  bool ok = false;
  REQUIRE(RunDoctor(o, &f, &ok).ok());
  CHECK(ok);
  std::vector<std::string> topics;
  for (const Finding& x : f) topics.push_back(x.topic);
  CHECK(topics == std::vector<std::string>{"cpu", "memory", "filesystem", "cache size",
                                           "cache verify", "gpu", "pinned memory", "libraries"});
  CHECK_THAT(f.back().text, Catch::StartsWith("LMDB 0.9.") && Catch::Contains("oneTBB 20"));

  o.cache = dir / "absent";
  f.clear();
  const Status s = RunDoctor(o, &f, &ok);
  CHECK(s.IsNotFound());
  CHECK_THAT(s.ToString(), Catch::Contains("absent: no such cache directory"));
}
