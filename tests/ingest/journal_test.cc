// The build journal: how a build starts (up to date, resumed, fresh or
// refused as stale), the reject log across a resume, the resume point.
#include "journal.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "kiln/cache_layout.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::ingest;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {
// A finished cache of sample_data's Fashion-MNIST val split; its recipe.
Preprocessing BuildSmallCache(const std::string& out) {
  BuildOptions o;
  o.src = std::string(KILN_SAMPLE_DATA) + "/fashion/val";
  o.out = out;
  o.channels = 1;
  BuildResult r;
  REQUIRE(BuildCache(o, nullptr, nullptr, &r).ok());
  Manifest m;
  REQUIRE(ReadManifest(out, &m).ok());
  return m.preprocessing;
}
const InfoFn kQuiet = [](const std::string&) {};
}  // namespace

TEST_CASE("a build starts fresh, up to date, or is refused as stale", "[journal]") {
  TempDir dir;
  BuildStart start;
  REQUIRE(DecideStart(dir.path(), Preprocessing(), Rebuild::kNo, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kFresh);

  const Preprocessing recipe = BuildSmallCache(dir.path());
  std::string said;
  REQUIRE(
      DecideStart(
          dir.path(), recipe, Rebuild::kNo, false, [&](const std::string& l) { said = l; }, &start)
          .ok());
  CHECK(start == BuildStart::kUpToDate);
  CHECK_THAT(said, Catch::Contains("up to date"));

  Preprocessing other = recipe;
  other.resize = 32;
  Status s = DecideStart(dir.path(), other, Rebuild::kNo, false, kQuiet, &start);
  CHECK(s.IsStale());
  CHECK_THAT(s.message(), Catch::Contains("resize: 0 -> 32") && Catch::Contains("--force"));
  REQUIRE(DecideStart(dir.path(), other, Rebuild::kIfChanged, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kFresh);
  // --rebuild-if-changed keeps an up-to-date cache; --force rebuilds it.
  REQUIRE(DecideStart(dir.path(), recipe, Rebuild::kIfChanged, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kUpToDate);
  REQUIRE(DecideStart(dir.path(), recipe, Rebuild::kAlways, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kFresh);
}

TEST_CASE("an unfinished build resumes with its own recipe only", "[journal]") {
  TempDir dir;
  const Preprocessing recipe = BuildSmallCache(dir.path());
  // What a fresh start leaves: no manifest, no shards, the recipe recorded.
  REQUIRE(BeginFreshBuild(dir.path(), recipe).ok());
  CHECK_FALSE(fs::exists(dir / kManifestName));
  CHECK_FALSE(fs::exists(dir / ShardFileName(0)));
  CHECK_FALSE(fs::exists(dir / kSourcesTsvName));
  BuildStart start;
  REQUIRE(DecideStart(dir.path(), recipe, Rebuild::kNo, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kResume);
  Preprocessing other = recipe;
  other.crop = 20;
  Status s = DecideStart(dir.path(), other, Rebuild::kNo, false, kQuiet, &start);
  CHECK(s.IsStale());
  CHECK_THAT(s.message(), Catch::Contains("unfinished") && Catch::Contains("crop: 0 -> 20"));
  WriteFile(dir / kBuildStateName, "not json");
  s = DecideStart(dir.path(), recipe, Rebuild::kNo, false, kQuiet, &start);
  CHECK_THAT(s.message(), Catch::Contains("unreadable"));
  REQUIRE(DecideStart(dir.path(), recipe, Rebuild::kIfChanged, false, kQuiet, &start).ok());
  CHECK(start == BuildStart::kFresh);
  EndBuild(dir.path());
  CHECK_FALSE(fs::exists(dir / kBuildStateName));
}

TEST_CASE("the reject log survives a resume and becomes rejects.tsv", "[journal]") {
  TempDir dir;
  {
    RejectLog log;
    REQUIRE(log.Open(dir.path(), false).ok());
    REQUIRE(log.Add(3, "/src/a.jpg", "bad\theader\nhere").ok());
    CHECK(log.rejected(3));
    CHECK_FALSE(log.rejected(2));
  }
  RejectLog log;
  REQUIRE(log.Open(dir.path(), true).ok());
  CHECK(log.before() == std::set<size_t>{3});
  // The reason's tab and line break are escaped: still one line, two fields.
  REQUIRE(log.lines() == std::vector<std::string>{"/src/a.jpg\tbad\\theader\\nhere"});
  REQUIRE(log.Add(7, "/src/b.png", "empty file").ok());
  REQUIRE(log.WriteTsv().ok());
  CHECK(ReadFile(dir / kRejectsName) ==
        "path\treason\n/src/a.jpg\tbad\\theader\\nhere\n/src/b.png\tempty file\n");
  CHECK(RejectText(log.lines()[1]) == "/src/b.png: empty file");
}

TEST_CASE("a damaged reject log is a Corruption naming its line, never an exception", "[journal]") {
  // Regression: the positions were read with std::stoull, which threw out
  // of BuildCache for "x" and took "-1" as 2^64 - 1.
  std::set<size_t> positions;
  std::vector<std::string> lines;
  REQUIRE(ParseRejectLog("3\ta.jpg\tbad\n12\n7\tb.jpg\tempty", "r", &positions, &lines).ok());
  CHECK(positions == std::set<size_t>{3, 7});  // "12" without a tab: a write cut short
  CHECK(lines == std::vector<std::string>{"a.jpg\tbad", "b.jpg\tempty"});
  for (const char* text : {"x\ta\tb\n", "\ta\tb\n", "-1\ta\tb\n", "99999999999999999999999\ta\tb\n",
                           "3\ta\tb\n 4\ta\tb\n"}) {
    const Status s = ParseRejectLog(text, "r.partial", &positions, &lines);
    INFO(text);
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("r.partial:"));
  }
  // Through a resumed RejectLog.
  TempDir dir;
  WriteFile(dir / kRejectLogName, "oops\ta\tb\n");
  RejectLog log;
  const Status s = log.Open(dir.path(), /*resume=*/true);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains(kRejectLogName));
}

TEST_CASE("the resume point skips written records and earlier rejects", "[journal]") {
  CHECK(ResumePoint(10, 0, {}) == 0);
  CHECK(ResumePoint(10, 0, {0, 1}) == 2);
  CHECK(ResumePoint(10, 3, {1}) == 4);     // 0, 2, 3 written
  CHECK(ResumePoint(10, 3, {1, 4}) == 5);  // and 4 rejected before
  CHECK(ResumePoint(4, 4, {}) == 4);       // all done
}
