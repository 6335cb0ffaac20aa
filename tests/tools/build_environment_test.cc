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
#include <functional>
#include <string>

#include "ingest/ingest_test_util.h"
#include "test_skip.h"
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

// Whether KilnAsUser can run here (as root it needs setpriv, util-linux's).
bool CanRunAsUser() {
  std::string out;
  if (::geteuid() != 0 || RunCommand("setpriv --version", &out) == 0) return true;
  Skip(SkipWhy::kNotBuilt, "running as root without setpriv: permission cases not checked");
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

// SRC with three good images (a/1.jpg, a/2.jpg, b/3.jpg) and what `more`
// adds, handed to the user KilnAsUser runs as; OUT beside it.
struct UserTree {
  explicit UserTree(const std::function<void(const std::string& src)>& more) {
    CopyPhoto("chelsea.jpg", src + "/a/1.jpg");
    CopyPhoto("coffee.jpg", src + "/a/2.jpg");
    CopyPhoto("camera.jpg", src + "/b/3.jpg");
    more(src);
    GiveToUser(dir);
  }
  void SetMode(const std::string& rel, mode_t mode) {
    REQUIRE(::chmod((src + "/" + rel).c_str(), mode) == 0);
  }
  // kiln build SRC OUT as that user, which must exit 0: its output.
  std::string Build() const {
    std::string log;
    REQUIRE(KilnAsUser("build " + src + " " + out + kOpts, &log) == 0);
    return log;
  }
  // OUT holds what a fresh build of SRC as it is now writes.
  void CheckSameAsFresh() const {
    std::string log;
    REQUIRE(KilnAsUser("build " + src + " " + dir / "fresh" + kOpts, &log) == 0);
    CHECK(CacheFiles(out) == CacheFiles(dir / "fresh"));
  }

  TempDir dir;
  const std::string src = dir / "src", out = dir / "out";
};

}  // namespace

TEST_CASE("a file that could not be read is retried by the next run", "[cli][retry]") {
  if (!CanRunAsUser()) return;
  const std::string locked = "b/locked.jpg";
  UserTree t([&](const std::string& src) {
    CopyPhoto("rocket.jpg", src + "/" + locked);
    WriteFile(src + "/b/bad.jpg", "not an image\n");  // a reject no retry can mend
  });
  t.SetMode(locked, 0);

  // Permission denied: a reject marked for retry, and the summary says so.
  std::string log = t.Build();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("3 written, 2 rejected") &&
                      Catch::Contains("1 rejected input can be retried"));
  CHECK(ReadFile(t.out + "/rejects.tsv") ==
        "path\treason\tretry\n" + t.src +
            "/b/bad.jpg\tb/bad.jpg: not a JPEG, PNG, BMP, WebP or "
            "TIFF image\tno\n" +
            t.src + "/b/locked.jpg\tcannot open: Permission denied\tyes\n");

  // Still unreadable: tried again, nothing rebuilt, and not "up to date".
  const auto before = CacheFiles(t.out);
  log = t.Build();
  CHECK_THAT(log, Catch::Contains("1 rejected input that can be retried still fails: " + t.src +
                                  "/b/locked.jpg: cannot open: Permission denied") &&
                      Catch::Contains("1 rejected input can be retried") &&
                      !Catch::Contains("up to date") && !Catch::Contains("kiln build:"));
  CHECK(CacheFiles(t.out) == before);

  // Fixed: the next run with the same arguments picks it up, and the cache
  // is the one a fresh build of the fixed tree writes.
  t.SetMode(locked, 0644);
  log = t.Build();
  CHECK_THAT(log, Catch::Contains("locked.jpg") && Catch::Contains("rebuilding") &&
                      Catch::Contains("4 written, 1 rejected") &&
                      !Catch::Contains("can be retried"));
  CHECK_THAT(ReadFile(t.out + "/rejects.tsv"), !Catch::Contains("locked.jpg"));
  t.CheckSameAsFresh();
  CHECK_THAT(t.Build(), Catch::Contains("up to date"));
}

TEST_CASE("a symbolic link loop and an unreadable folder skip only themselves", "[cli][retry]") {
  if (!CanRunAsUser()) return;
  UserTree t([](const std::string& src) {
    fs::create_directory_symlink("..", src + "/a/loop");  // back to SRC: every image again, forever
    CopyPhoto("rocket.jpg", src + "/b/locked/4.jpg");
  });
  t.SetMode("b/locked", 0);

  // Every good image is built; the loop and the folder are reported, the
  // folder as one to retry.
  std::string log = t.Build();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("3 written, 2 rejected") &&
                      Catch::Contains("1 rejected input can be retried"));
  CHECK(ReadFile(t.out + "/rejects.tsv") ==
        "path\treason\tretry\n" + t.src + "/a/loop\ta symbolic link loop: it leads back to the " +
            "source root; not followed\tno\n" + t.src +
            "/b/locked\tcannot list the folder: Permission denied\tyes\n");
  std::string verify;
  CHECK(KilnAsUser("verify " + t.out + " --level sources", &verify) == 0);

  // Still unreadable: nothing rebuilt.
  const auto before = CacheFiles(t.out);
  log = t.Build();
  CHECK_THAT(log, Catch::Contains("1 rejected input that can be retried still fails: " + t.src +
                                  "/b/locked: cannot list the folder") &&
                      !Catch::Contains("kiln build:"));
  CHECK(CacheFiles(t.out) == before);

  // Readable: the next run lists it and rebuilds, to a fresh build's bytes.
  t.SetMode("b/locked", 0755);
  log = t.Build();
  CHECK_THAT(log, Catch::Contains("could not read some sources") &&
                      Catch::Contains("4 written, 1 rejected") &&
                      !Catch::Contains("can be retried"));
  t.CheckSameAsFresh();
}

TEST_CASE("OUT inside SRC is not listed as a source, and OUT = SRC is refused", "[cli]") {
  TempDir dir;
  const std::string src = dir / "src";
  CopyPhoto("chelsea.jpg", src + "/a/1.jpg");
  CopyPhoto("camera.jpg", src + "/b/2.jpg");
  std::string log;
  for (const std::string& out : {src + "/cache", src + "/a/cache"}) {
    INFO(out);
    const std::string cmd = "build " + src + " " + out + kOpts;
    REQUIRE(RunCommand(std::string(KILN_BIN) + " " + cmd, &log) == 0);
    CHECK_THAT(log, Catch::Contains("2 written, 0 rejected"));
    // The same command again: the cache is not a class, nor a source.
    REQUIRE(RunCommand(std::string(KILN_BIN) + " " + cmd, &log) == 0);
    CHECK_THAT(log, Catch::Contains("up to date"));
    CHECK(RunCommand(std::string(KILN_BIN) + " verify " + out + " --level sources", &log) == 0);
    // A picture put into the cache (kiln preview OUT -o OUT/grid.png) is no source either.
    CopyPhoto("coffee.jpg", out + "/grid.jpg");
    REQUIRE(RunCommand(std::string(KILN_BIN) + " " + cmd, &log) == 0);
    CHECK_THAT(log, Catch::Contains("up to date"));
    fs::remove_all(out);  // another OUT's cache would be a class folder without images
  }
  // With --val-fraction, OUT/train and OUT/val lie inside OUT.
  const std::string split = "build " + src + " " + src + "/splits --val-fraction 0.5" + kOpts;
  REQUIRE(RunCommand(std::string(KILN_BIN) + " " + split, &log) == 0);
  REQUIRE(RunCommand(std::string(KILN_BIN) + " " + split, &log) == 0);
  CHECK_THAT(log, Catch::Contains("up to date"));
  // Into SRC itself: refused before anything is written.
  CHECK(RunCommand(std::string(KILN_BIN) + " build " + src + " " + src + kOpts, &log) == 2);
  CHECK_THAT(log, Catch::Contains("is the source folder") && Catch::Contains("OUT outside it"));
  CHECK_FALSE(fs::exists(src + "/manifest.json"));
}
