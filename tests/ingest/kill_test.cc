// Crash safety at scale: kiln build killed with SIGKILL at 20 seeded random
// moments, resumed each time, ends with the bytes of an uninterrupted build.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "ingest_test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// Runs the kiln binary with `args` (its output to /dev/null); returns its pid.
int StartKiln(std::vector<std::string> args) {
  args.insert(args.begin(), KILN_BIN);
  return StartProcess(args);
}

}  // namespace

TEST_CASE("kiln build killed at 20 seeded random moments resumes to identical bytes",
          "[build][kill]") {
  TempDir src, ref, out;
  MakePhotoFolder(src.path(), 40);  // 280 JPEGs
  const std::vector<std::string> flags = {"--resize", "64",   "--crop",      "56",  "--dtype",
                                          "float32",  "--threads", "1", "--shard-size", "4M",
                                          "--progress", "none"};
  auto args = [&](const std::string& dir) {
    std::vector<std::string> a = {"build", src.path(), dir};
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  // The uninterrupted build, timed: the kill moments spread over its length.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(WaitExit(StartKiln(args(ref.path()))) == 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937_64 rng(20261203);
  std::uniform_real_distribution<double> moment(0.0, 1.0);
  int killed = 0, finished_early = 0;
  // A resumed run has less to do: one that finishes before its kill is
  // started over (and does not count), until 20 kills have landed.
  for (int round = 0; killed < 20 && round < 80; ++round) {
    if (fs::exists(out / kManifestName)) {  // a run finished: start over, kill again
      ++finished_early;
      fs::remove_all(out.path());
      fs::create_directories(out.path());
    }
    const int pid = StartKiln(args(out.path()));
    std::this_thread::sleep_for(std::chrono::duration<double>(moment(rng) * seconds));
    ::kill(pid, SIGKILL);
    const int status = WaitExit(pid);
    INFO("round " << round << ": exit " << status);
    CHECK((status == 128 + SIGKILL || status == 0));
    killed += status == 128 + SIGKILL;
    // Nothing half-done looks complete: a manifest means a cache that verifies.
    if (fs::exists(out / kManifestName)) CHECK(Problems(out.path()) == "");
  }
  REQUIRE(killed == 20);
  const int status = WaitExit(StartKiln(args(out.path())));
  REQUIRE(status == 0);
  CHECK(CacheFiles(out.path()) == CacheFiles(ref.path()));
  CHECK(Problems(out.path()) == "");
  WARN("killed " << killed << " times, " << finished_early << " runs finished first; one build "
                 << seconds << " s");
}
