// kiln build where the environment, not an image, gets in the way: files
// and folders it may not read, symbolic link loops, an OUT inside SRC. What
// a new user hits first; each case ends with every good image built and the
// rest reported, and a fixed cause is picked up by the next run.
//
// Root reads any file, so where a test needs a permission to bite it runs
// kiln as the user nobody (setpriv), as tests/tools/test_hostile_inputs.py
// does.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "ingest/ingest_test_util.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

constexpr int kNobody = 65534;
const std::string kOpts = " --resize 32 --crop 32 --progress none";

// Runs kiln with `args` as a user the permission bits bind: nobody when
// this test runs as root. Its exit status; stdout and stderr in *out.
int KilnAsUser(const std::string& args, std::string* out) {
  const std::string kiln = std::string(KILN_BIN) + " " + args;
  if (::geteuid() != 0) return RunCommand(kiln, out);
  return RunCommand("setpriv --reuid=" + std::to_string(kNobody) + " --regid=" +
                        std::to_string(kNobody) + " --clear-groups " + kiln,
                    out);
}

// Whether KilnAsUser can run here (as root it needs setpriv). Catch2 v2
// has no SKIP: a test that cannot run says so and passes.
bool CanRunAsUser() {
  std::string out;
  if (::geteuid() != 0 || RunCommand("setpriv --version", &out) == 0) return true;
  WARN("running as root without setpriv: permission cases not checked");
  return false;
}

// Hands the tree below `dir` to the user KilnAsUser runs as.
void GiveToUser(const TempDir& dir) {
  REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);
  if (::geteuid() != 0) return;
  REQUIRE(::chown(dir.path().c_str(), kNobody, kNobody) == 0);
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    REQUIRE(::lchown(e.path().c_str(), kNobody, kNobody) == 0);
}

void CopyPhoto(const std::string& photo, const std::string& to) {
  fs::create_directories(fs::path(to).parent_path());
  fs::copy_file(kPhotos + "/" + photo, to);
}

}  // namespace

TEST_CASE("a file that could not be read is retried by the next run", "[cli][retry]") {
  if (!CanRunAsUser()) return;
  TempDir dir;
  const std::string src = dir / "src", out = dir / "out", fresh = dir / "fresh";
  CopyPhoto("chelsea.jpg", src + "/a/1.jpg");
  CopyPhoto("coffee.jpg", src + "/a/2.jpg");
  CopyPhoto("camera.jpg", src + "/b/3.jpg");
  CopyPhoto("rocket.jpg", src + "/b/locked.jpg");
  WriteFile(src + "/b/bad.jpg", "not an image\n");  // a reject no retry can mend
  GiveToUser(dir);
  REQUIRE(::chmod((src + "/b/locked.jpg").c_str(), 0) == 0);
  const std::string cmd = "build " + src + " " + out + kOpts;
  std::string log;

  // Permission denied: a reject marked for retry, and the summary says so.
  REQUIRE(KilnAsUser(cmd, &log) == 0);
  INFO(log);
  CHECK_THAT(log, Catch::Contains("3 written, 2 rejected") &&
                      Catch::Contains("1 rejected input can be retried"));
  CHECK(ReadFile(out + "/rejects.tsv") ==
        "path\treason\tretry\n" + src + "/b/bad.jpg\tb/bad.jpg: not a JPEG, PNG, BMP, WebP or "
        "TIFF image\tno\n" + src + "/b/locked.jpg\tcannot open: Permission denied\tyes\n");

  // Still unreadable: tried again, nothing rebuilt, and not "up to date".
  const auto before = CacheFiles(out);
  REQUIRE(KilnAsUser(cmd, &log) == 0);
  CHECK_THAT(log, Catch::Contains("1 rejected input that can be retried still fails: " + src +
                                  "/b/locked.jpg: cannot open: Permission denied") &&
                      Catch::Contains("1 rejected input can be retried") &&
                      !Catch::Contains("up to date") && !Catch::Contains("kiln build:"));
  CHECK(CacheFiles(out) == before);

  // Fixed: the next run with the same arguments picks it up, and the cache
  // is the one a fresh build of the fixed tree writes.
  REQUIRE(::chmod((src + "/b/locked.jpg").c_str(), 0644) == 0);
  REQUIRE(KilnAsUser(cmd, &log) == 0);
  CHECK_THAT(log, Catch::Contains("locked.jpg") && Catch::Contains("rebuilding") &&
                      Catch::Contains("4 written, 1 rejected") &&
                      !Catch::Contains("can be retried"));
  CHECK_THAT(ReadFile(out + "/rejects.tsv"), !Catch::Contains("locked.jpg"));
  REQUIRE(KilnAsUser("build " + src + " " + fresh + kOpts, &log) == 0);
  CHECK(CacheFiles(out) == CacheFiles(fresh));
  REQUIRE(KilnAsUser(cmd, &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date"));
}
