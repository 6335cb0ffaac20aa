// A build onto a filesystem that fills up: a clear "no space left" error
// naming the cache, nothing that looks complete, and a resume to the same
// bytes once there is space.
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "ingest_test_util.h"
#include "kiln/cache_layout.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// A directory with little room: a 2 MB tmpfs where this process may mount
// one (root), otherwise a 2 MB RLIMIT_FSIZE on this process with SIGXFSZ
// ignored (writes past it fail with EFBIG). Grow() gives room back.
class SmallSpace {
 public:
  explicit SmallSpace(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ = ::geteuid() == 0 && ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=2m") == 0;
    if (!mounted_) {
      ::getrlimit(RLIMIT_FSIZE, &saved_);
      old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = saved_;
      small.rlim_cur = 2 << 20;
      limited_ = ::setrlimit(RLIMIT_FSIZE, &small) == 0;
    }
  }
  ~SmallSpace() {
    Grow();
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  void Grow() {
    if (mounted_) {
      ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, "size=256m");
    } else if (limited_) {
      ::setrlimit(RLIMIT_FSIZE, &saved_);
      ::signal(SIGXFSZ, old_handler_);
      limited_ = false;
    }
  }
  bool ready() const { return mounted_ || limited_; }
  const char* how() const { return mounted_ ? "tmpfs of 2 MB" : "RLIMIT_FSIZE of 2 MB"; }

 private:
  std::string dir_;
  bool mounted_ = false, limited_ = false;
  struct rlimit saved_ {};
  sighandler_t old_handler_ = SIG_DFL;
};

}  // namespace

TEST_CASE("a build that runs out of space says so, looks unfinished, and resumes to the same bytes",
          "[build][full-disk]") {
  TempDir src, ref, work;
  MakePhotoFolder(src.path(), 20);  // 140 records of 3x64x64 float32: 6.9 MB of payload
  ingest::BuildOptions o = BuildOf(src.path(), ref.path());
  o.resize = 72;
  o.crop = 64;
  o.dtype = DType::kFloat32;
  o.shard_size = 4 << 20;  // two shards
  REQUIRE(Build(o).status.ToString() == "OK");

  const std::string small = work / "small";
  const std::string cache = small + "/c";
  o.out = cache;
  Built b;
  {
    SmallSpace space(small);
    REQUIRE(space.ready());
    INFO(space.how());
    b = Build(o);
    REQUIRE(b.status.IsIOError());
    CHECK_THAT(b.status.message(), Catch::Contains(cache + "/") &&
                                       Catch::Contains("no space left for the cache") &&
                                       Catch::Contains("run the same command again"));
    CHECK_FALSE(fs::exists(cache + "/" + kManifestName));
    VerifyReport r;
    REQUIRE(VerifyCache(cache, VerifyOptions(), &r).ok());
    CHECK_FALSE(r.clean());  // the missing manifest: incomplete

    space.Grow();
    b = Build(o);
    REQUIRE(b.status.ToString() == "OK");
    CHECK(b.result.resumed);
    CHECK(Problems(cache) == "");
    for (const char* shard : {"shard-00000.mdb", "shard-00001.mdb"}) {
      CAPTURE(shard);
      CHECK(ReadFile(cache + "/" + shard) == ReadFile(ref / shard));
    }
    CHECK(ReadFile(cache + "/" + kManifestName) == ReadFile(ref / kManifestName));
  }
}
