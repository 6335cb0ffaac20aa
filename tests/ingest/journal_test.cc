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

// DecideStart for `recipe` with `rebuild`, as its Status; the start in *start.
Status Decide(const std::string& dir, const Preprocessing& recipe, Rebuild rebuild,
              BuildStart* start, const InfoFn& info = kQuiet) {
  StartRequest request;
  request.recipe = recipe;
  request.rebuild = rebuild;
  StartDecision decision;
  const Status s = DecideStart(dir, request, info, &decision);
  *start = decision.start;
  return s;
}
}  // namespace

TEST_CASE("a build starts fresh, up to date, or is refused as stale", "[journal]") {
  TempDir dir;
  BuildStart start;
  REQUIRE(Decide(dir.path(), Preprocessing(), Rebuild::kNo, &start).ok());
  CHECK(start == BuildStart::kFresh);

  const Preprocessing recipe = BuildSmallCache(dir.path());
  std::string said;
  REQUIRE(Decide(dir.path(), recipe, Rebuild::kNo, &start, [&](const std::string& l) {
            said = l;
          }).ok());
  CHECK(start == BuildStart::kUpToDate);
  CHECK_THAT(said, Catch::Contains("up to date"));

  Preprocessing other = recipe;
  other.resize = 32;
  Status s = Decide(dir.path(), other, Rebuild::kNo, &start);
  CHECK(s.IsStale());
  CHECK_THAT(s.message(), Catch::Contains("resize: 0 -> 32") && Catch::Contains("--force"));
  REQUIRE(Decide(dir.path(), other, Rebuild::kIfChanged, &start).ok());
  CHECK(start == BuildStart::kFresh);
  // --rebuild-if-changed keeps an up-to-date cache; --force rebuilds it.
  REQUIRE(Decide(dir.path(), recipe, Rebuild::kIfChanged, &start).ok());
  CHECK(start == BuildStart::kUpToDate);
  REQUIRE(Decide(dir.path(), recipe, Rebuild::kAlways, &start).ok());
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
  REQUIRE(Decide(dir.path(), recipe, Rebuild::kNo, &start).ok());
  CHECK(start == BuildStart::kResume);
  Preprocessing other = recipe;
  other.crop = 20;
  Status s = Decide(dir.path(), other, Rebuild::kNo, &start);
  CHECK(s.IsStale());
  CHECK_THAT(s.message(), Catch::Contains("unfinished") && Catch::Contains("crop: 0 -> 20"));
  WriteFile(dir / kBuildStateName, "not json");
  s = Decide(dir.path(), recipe, Rebuild::kNo, &start);
  CHECK_THAT(s.message(), Catch::Contains("unreadable"));
  REQUIRE(Decide(dir.path(), recipe, Rebuild::kIfChanged, &start).ok());
  CHECK(start == BuildStart::kFresh);
  EndBuild(dir.path());
  CHECK_FALSE(fs::exists(dir / kBuildStateName));
}

TEST_CASE("a finished cache with retryable rejects tries them again", "[journal]") {
  TempDir dir;
  StartRequest request;
  request.recipe = BuildSmallCache(dir.path());
  WriteFile(dir / kRejectsName,
            "path\treason\tretry\n/src/bad.png\tnot an image\tno\n"
            "/src/locked.png\tcannot open: Permission denied\tyes\n");
  std::vector<std::string> tried;
  bool now_readable = false;
  request.retry = [&](const RejectEntry& e) {
    tried.push_back(e.path);
    return now_readable;
  };
  std::string said;
  const InfoFn info = [&](const std::string& l) { said = l; };
  StartDecision d;
  // Still failing: the cache stays, and says so instead of "up to date".
  REQUIRE(DecideStart(dir.path(), request, info, &d).ok());
  CHECK(d.start == BuildStart::kUpToDate);
  CHECK(tried == std::vector<std::string>{"/src/locked.png"});  // only the retryable one
  CHECK(d.still_failing ==
        std::vector<RejectEntry>{{"/src/locked.png", "cannot open: Permission denied", true}});
  CHECK_THAT(said, Catch::Contains("1 rejected input that can be retried still fails: "
                                   "/src/locked.png: cannot open: Permission denied") &&
                       !Catch::Contains("up to date"));
  // Readable now: rebuilt.
  now_readable = true;
  REQUIRE(DecideStart(dir.path(), request, info, &d).ok());
  CHECK(d.start == BuildStart::kFresh);
  CHECK_THAT(said, Catch::Contains("/src/locked.png") && Catch::Contains("rebuilding"));
  // --strict: retried first, then the rejects that remain fail it.
  now_readable = false;
  request.strict = true;
  const Status s = DecideStart(dir.path(), request, info, &d);
  CHECK(s.IsCorruption());
  CHECK_THAT(s.message(), Catch::Contains("/src/bad.png"));
}

TEST_CASE("a build that could not read some sources is rebuilt when they read otherwise now",
          "[journal]") {
  TempDir dir;
  const Preprocessing built = BuildSmallCache(dir.path());
  // What a build that could not list one folder records.
  Manifest m;
  REQUIRE(ReadManifest(dir.path(), &m).ok());
  m.preprocessing.source.unreadable = 1;
  REQUIRE(WriteManifest(dir.path(), m).ok());
  // The folder reads now: more files, another digest (and with --norm auto
  // other statistics). That is the retry: rebuilt without an option.
  Preprocessing now = built;
  now.source.digest = "0123456789abcdef";
  now.source.files += 3;
  BuildStart start;
  std::string said;
  REQUIRE(
      Decide(dir.path(), now, Rebuild::kNo, &start, [&](const std::string& l) { said = l; }).ok());
  CHECK(start == BuildStart::kFresh);
  CHECK_THAT(said, Catch::Contains("could not read some sources") && Catch::Contains("rebuilding"));
  // Another option changed too: not a retry, but a changed cache.
  now.resize = 32;
  CHECK(Decide(dir.path(), now, Rebuild::kNo, &start).IsStale());
  // A build that read everything: changed sources need an option.
  m.preprocessing.source.unreadable = 0;
  REQUIRE(WriteManifest(dir.path(), m).ok());
  now.resize = built.resize;
  CHECK(Decide(dir.path(), now, Rebuild::kNo, &start).IsStale());
}

TEST_CASE("the reject log survives a resume and becomes rejects.tsv", "[journal]") {
  TempDir dir;
  {
    RejectLog log;
    REQUIRE(log.Open(dir.path(), false).ok());
    REQUIRE(log.Add(3, "/src/a.jpg", "bad\theader\nhere", false).ok());
    CHECK(log.rejected(3));
    CHECK_FALSE(log.rejected(2));
  }
  RejectLog log;
  REQUIRE(log.Open(dir.path(), true).ok());
  CHECK(log.before() == std::set<size_t>{3});
  // The reason's tab and line break are escaped: still one line, four fields.
  REQUIRE(log.entries() == std::vector<RejectEntry>{{"/src/a.jpg", "bad\\theader\\nhere", false}});
  REQUIRE(log.Add(7, "/src/b.png", "cannot open: Permission denied", true).ok());
  CHECK(log.retryable() == 1);
  REQUIRE(log.WriteTsv().ok());
  CHECK(ReadFile(dir / kRejectsName) ==
        "path\treason\tretry\n/src/a.jpg\tbad\\theader\\nhere\tno\n"
        "/src/b.png\tcannot open: Permission denied\tyes\n");
  CHECK(log.entries()[1].Text() == "/src/b.png: cannot open: Permission denied");
  std::vector<RejectEntry> read;
  REQUIRE(ReadRejectsTsv(dir / kRejectsName, &read).ok());
  CHECK(read == log.entries());
  // A rejects.tsv of an older kiln, without the retry column: nothing retried.
  WriteFile(dir / "old.tsv", "path\treason\n/src/c.jpg\tnot a JPEG\n");
  REQUIRE(ReadRejectsTsv(dir / "old.tsv", &read).ok());
  CHECK(read == std::vector<RejectEntry>{{"/src/c.jpg", "not a JPEG", false}});
  CHECK(ReadRejectsTsv(dir / "none.tsv", &read).IsNotFound());
}

TEST_CASE("a damaged reject log is a Corruption naming its line, never an exception", "[journal]") {
  // Regression: the positions were read with std::stoull, which threw out
  // of BuildCache for "x" and took "-1" as 2^64 - 1.
  std::set<size_t> positions;
  std::vector<RejectEntry> entries;
  REQUIRE(
      ParseRejectLog("3\ta.jpg\tbad\n12\n7\tb.jpg\tempty\tyes", "r", &positions, &entries).ok());
  CHECK(positions == std::set<size_t>{3, 7});  // "12" without a tab: a write cut short
  CHECK(entries == std::vector<RejectEntry>{{"a.jpg", "bad", false}, {"b.jpg", "empty", true}});
  for (const char* text : {"x\ta\tb\n", "\ta\tb\n", "-1\ta\tb\n", "99999999999999999999999\ta\tb\n",
                           "3\ta\tb\n 4\ta\tb\n"}) {
    const Status s = ParseRejectLog(text, "r.partial", &positions, &entries);
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
