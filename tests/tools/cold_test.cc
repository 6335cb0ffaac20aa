// kiln bench on a cache that is not in memory: --cold, and a cache three
// times larger than the memory cgroup it runs in.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "test_skip.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

int Kiln(const std::string& args, std::string* out) {
  return RunCommand(std::string(KILN_BIN) + " " + args, out);
}

// A memory cgroup (v1) made for one test and removed after it.
class MemoryCgroup {
 public:
  static constexpr const char* kRoot = "/sys/fs/cgroup/memory";
  explicit MemoryCgroup(uint64_t limit)
      : path_(std::string(kRoot) + "/kiln-test-" + std::to_string(getpid())) {
    if (geteuid() != 0 ||
        access((std::string(kRoot) + "/memory.limit_in_bytes").c_str(), W_OK) != 0)
      return;
    if (mkdir(path_.c_str(), 0755) != 0) return;
    std::ofstream(path_ + "/memory.limit_in_bytes") << limit;
    ok_ = true;
  }
  ~MemoryCgroup() {
    if (ok_) rmdir(path_.c_str());
  }
  bool ok() const { return ok_; }
  // A shell prefix that moves the command into the cgroup first.
  std::string Enter() const { return "echo $$ > " + path_ + "/cgroup.procs && exec "; }
  uint64_t Failcnt() const {
    uint64_t n = 0;
    std::ifstream(path_ + "/memory.failcnt") >> n;
    return n;
  }

 private:
  std::string path_;
  bool ok_ = false;
};

}  // namespace

TEST_CASE("kiln bench --cold drops the cache before each epoch and measures the disk's floors",
          "[cli]") {
  TempDir dir;
  if (OnTmpfs(dir.path())) {
    Skip(SkipWhy::kHostCannot, dir.path() + " is on tmpfs, whose pages cannot be dropped");
    return;
  }
  WriteTestCache(dir.path(), 400, DType::kFloat16, MakeShape({3, 32, 32}));
  std::string out;
  REQUIRE(Kiln("bench " + dir.path() + " --batch 32 --epochs 2 --cold", &out) == 0);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("epoch 1:") && Catch::Contains("(cold)") &&
                      Catch::Contains("read-ahead"));
  CHECK_THAT(out, !Catch::Contains("stays in memory"));
  CHECK_THAT(out, Catch::Contains("disk floor, sequential read of the shards"));
  for (const char* t : {" 1 threads", " 2 threads", " 8 threads", "32 threads"})
    CHECK_THAT(out, Catch::Contains(std::string("random record reads, ") + t));
  CHECK_THAT(out, Catch::Contains("loader / best random-read floor = ") &&
                      Catch::Contains("loader / sequential-read floor = "));
  // Without --cold, a cache not in memory is not measured against memcpy as a floor.
  REQUIRE(Kiln("bench " + dir.path() + " --batch 32 --epochs 1 --readahead 0", &out) == 0);
  CHECK_THAT(out, Catch::Contains("read-ahead off") && Catch::Contains("loader / floor = "));
  CHECK(Kiln("bench " + dir.path() + " --readahead lots", &out) == 2);
  CHECK_THAT(out, Catch::Contains("--readahead"));
}

TEST_CASE("the loader in a memory cgroup a third of the cache's size finishes every epoch",
          "[cli]") {
  TempDir dir;
  // 6000 records of 24.6 KB: 148 MB of shards against a 48 MiB limit.
  MemoryCgroup cgroup(48ull << 20);
  if (!cgroup.ok()) {
    Skip(SkipWhy::kHostCannot, std::string("needs root and a writable cgroup v1 memory controller at ") +
                                   MemoryCgroup::kRoot);
    return;
  }
  WriteTestCache(dir.path(), 6000, DType::kFloat16, MakeShape({3, 64, 64}));
  std::string out;
  const int rc = RunCommand("sh -c '" + cgroup.Enter() + KILN_BIN + " bench " + dir.path() +
                                " --batch 32 --epochs 3 --cold'",
                            &out);
  INFO(out);
  CHECK(rc == 0);  // not killed by the cgroup's OOM killer
  for (const char* e : {"epoch 0:", "epoch 1:", "epoch 2:"}) CHECK_THAT(out, Catch::Contains(e));
  CHECK_THAT(out, Catch::Contains("loader / best random-read floor = "));
}
