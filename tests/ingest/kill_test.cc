// Crash safety at scale: kiln build killed with SIGKILL at 20 seeded random
// moments, resumed each time, ends with the bytes of an uninterrupted build.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "ingest_test_util.h"
#include "kiln/image/decode.h"
#include "kiln/image/render.h"
#include "sources_tsv.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// Runs the kiln binary with `args` (its output to /dev/null); returns its pid.
int StartKiln(std::vector<std::string> args) {
  args.insert(args.begin(), KILN_BIN);
  return StartProcess(args);
}

// Runs kiln with `args` and sends it SIGKILL after `seconds`: true when the
// kill landed (false: it finished first).
bool KilledAfter(const std::vector<std::string>& args, double seconds) {
  const int pid = StartKiln(args);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  ::kill(pid, SIGKILL);
  const int status = WaitExit(pid);
  CHECK((status == 128 + SIGKILL || status == 0));
  return status == 128 + SIGKILL;
}

// Builds SRC with `flags` into a reference and, killed 20 times, into
// another folder; the two must end with the same bytes.
void KillAndResume(const std::string& src_dir, const std::vector<std::string>& flags,
                   uint64_t seed, int kills = 20) {
  TempDir ref, out;
  const std::string src = src_dir;
  auto args = [&](const std::string& dir) {
    std::vector<std::string> a = {"build", src, dir};
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  // The uninterrupted build, timed: the kill moments spread over its length.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(WaitExit(StartKiln(args(ref.path()))) == 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> moment(0.0, 1.0);
  int killed = 0, finished_early = 0;
  // A resumed run has less to do: one that finishes before its kill is
  // started over (and does not count), until `kills` kills have landed.
  for (int round = 0; killed < kills && round < 4 * kills; ++round) {
    if (fs::exists(out / kManifestName)) {  // a run finished: start over, kill again
      ++finished_early;
      fs::remove_all(out.path());
      fs::create_directories(out.path());
    }
    INFO("round " << round);
    killed += KilledAfter(args(out.path()), moment(rng) * seconds);
    // Nothing half-done looks complete: a manifest means a cache that verifies.
    if (fs::exists(out / kManifestName)) CHECK(Problems(out.path()) == "");
  }
  REQUIRE(killed == kills);
  const int status = WaitExit(StartKiln(args(out.path())));
  REQUIRE(status == 0);
  CHECK(CacheFiles(out.path()) == CacheFiles(ref.path()));
  CHECK(Problems(out.path()) == "");
  WARN("killed " << killed << " times, " << finished_early << " runs finished first; one build "
                 << seconds << " s");
}

}  // namespace

TEST_CASE("kiln build killed at 20 seeded random moments resumes to identical bytes",
          "[build][kill]") {
  TempDir src;
  MakePhotoFolder(src.path(), 40);  // 280 JPEGs
  KillAndResume(src.path(),
                {"--resize", "64", "--crop", "56", "--dtype", "float32", "--threads", "1",
                 "--shard-size", "4M", "--progress", "none"},
                20261203);
}

TEST_CASE("a format 2 build (whole images, masks) killed at 20 moments resumes to identical bytes",
          "[build][kill]") {
  TempDir src, masks;
  MakePhotoFolder(src.path(), 40);
  // A mask of each image's size (its header's), values from the file name.
  for (const auto& e : fs::recursive_directory_iterator(src.path())) {
    if (!e.is_regular_file()) continue;
    const std::string bytes = ReadFile(e.path().string());
    image::ImageU8 mask;
    REQUIRE(image::ReadHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                              e.path().string(), &mask.width, &mask.height)
                .ok());
    mask.channels = 1;
    mask.pixels.resize(static_cast<size_t>(mask.width) * mask.height);
    for (size_t i = 0; i < mask.pixels.size(); ++i)
      mask.pixels[i] = static_cast<uint8_t>((i / 7 + bytes.size()) % 5);
    const fs::path rel = fs::relative(e.path(), src.path());
    fs::create_directories(masks / rel.parent_path());
    REQUIRE(image::WriteImage(mask, masks / ingest::MaskRelPath(rel.string())).ok());
  }
  KillAndResume(src.path(),
                {"--max-side", "64", "--masks", masks.path(), "--dtype", "uint8", "--threads", "1",
                 "--shard-size", "1M", "--progress", "none"},
                20261205);
}

TEST_CASE("a --encode jpeg build (records in packs) killed at 10 moments resumes to identical bytes",
          "[build][kill]") {
  TempDir src;
  MakePhotoFolder(src.path(), 40);
  KillAndResume(src.path(),
                {"--max-side", "64", "--encode", "jpeg", "--threads", "1", "--shard-size", "256K",
                 "--progress", "none"},
                20261207, 10);
}

TEST_CASE("kiln build --append killed at 20 seeded random moments resumes to identical shards",
          "[build][kill][append]") {
  TempDir src, extra, base, ref, out;
  MakePhotoFolder(src.path(), 40);  // 280 JPEGs; every second one is added later
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(src.path()))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (size_t i = 1; i < files.size(); i += 2) {
    const fs::path to = extra / fs::relative(files[i], src.path()).string();
    fs::create_directories(to.parent_path());
    fs::rename(files[i], to);
  }
  const std::vector<std::string> flags = {"--resize", "64", "--crop", "56", "--dtype", "float32",
                                          "--threads", "1", "--shard-size", "1M",
                                          "--progress", "none"};
  auto args = [&](const std::string& dir, bool append) {
    std::vector<std::string> a = {"build", src.path(), dir};
    a.insert(a.end(), flags.begin(), flags.end());
    if (append) a.push_back("--append");
    return a;
  };
  REQUIRE(WaitExit(StartKiln(args(base.path(), false))) == 0);
  for (const auto& e : fs::recursive_directory_iterator(extra.path()))
    if (e.is_regular_file()) {
      const fs::path to = src / fs::relative(e.path(), extra.path()).string();
      fs::create_directories(to.parent_path());
      fs::rename(e.path(), to);
    }
  auto reset = [&](const TempDir& dir) {
    fs::remove_all(dir.path());
    fs::copy(base.path(), dir.path(), fs::copy_options::recursive);
  };
  reset(ref);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(WaitExit(StartKiln(args(ref.path(), true))) == 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Manifest want;
  REQUIRE(ReadManifest(ref.path(), &want).ok());
  REQUIRE(want.count == files.size());

  std::mt19937_64 rng(20261207);
  std::uniform_real_distribution<double> moment(0.0, 1.0);
  int killed = 0;
  reset(out);
  for (int round = 0; killed < 20 && round < 80; ++round) {
    Manifest now;
    REQUIRE(ReadManifest(out.path(), &now).ok());
    if (now.count == want.count) reset(out);  // the append finished first: again
    INFO("round " << round);
    killed += KilledAfter(args(out.path(), true), moment(rng) * seconds);
    // Whatever the moment: the old records or all of them, verified.
    REQUIRE(ReadManifest(out.path(), &now).ok());
    CHECK((now.count == want.count || now.count == want.appends[0].count_before));
    CHECK(Problems(out.path()) == "");
    // sources.tsv describes the records the manifest has, no more.
    std::vector<ingest::RecordedSource> listed;
    REQUIRE(ingest::ReadSourcesTsv(out / kSourcesTsvName, &listed).ok());
    uint64_t recorded = 0;
    for (const ingest::RecordedSource& r : listed) {
      CHECK(r.record < static_cast<int64_t>(now.count));
      recorded += r.record >= 0;
    }
    CHECK(recorded == now.count);
  }
  REQUIRE(killed == 20);
  REQUIRE(WaitExit(StartKiln(args(out.path(), true))) == 0);
  Manifest got;
  REQUIRE(ReadManifest(out.path(), &got).ok());
  REQUIRE(got.shards.size() == want.shards.size());
  for (size_t s = 0; s < got.shards.size(); ++s) {
    INFO(got.shards[s].file);
    CHECK(got.shards[s].digest == want.shards[s].digest);
    CHECK(ReadFile(out / got.shards[s].file) == ReadFile(ref / want.shards[s].file));
  }
  CHECK(ReadFile(out / kSourcesTsvName) == ReadFile(ref / kSourcesTsvName));
  CHECK(Problems(out.path()) == "");
}
