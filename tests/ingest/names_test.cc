// Any name a filesystem allows can be a record: tabs, line breaks,
// backslashes and bytes that are not UTF-8, in file and class names.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ingest_test_util.h"
#include "kiln/cache_layout.h"
#include "kiln/manifest.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

TEST_CASE("files and classes with tabs, line breaks and non-UTF-8 bytes become records",
          "[build][names]") {
  TempDir src, out;
  std::vector<fs::path> pngs;
  for (const auto& e : fs::recursive_directory_iterator(kFashion))
    if (e.is_regular_file()) pngs.push_back(e.path());
  std::sort(pngs.begin(), pngs.end());
  const std::string odd = src / "caf\xe9";  // Latin-1, not UTF-8
  fs::create_directories(odd);
  fs::create_directories(src / "plain");
  const std::vector<std::string> names = {"tab\there.png", "line\nbreak.png", "back\\slash.png",
                                          "bad\xff.png", "cr\r.png"};
  for (size_t i = 0; i < names.size(); ++i) fs::copy_file(pngs[i], odd + "/" + names[i]);
  fs::copy_file(pngs[10], src / "plain/ok.png");
  fs::copy_file(pngs[11], src / "plain/ok2.png");
  WriteFile(odd + "/empty\t.png", "");  // rejected, and listed with its name escaped

  const std::string cache = out / "c";
  ingest::BuildOptions o = BuildOf(src.path(), cache);
  o.channels = 1;
  Built b = Build(o);
  REQUIRE(b.status.ToString() == "OK");
  CHECK(b.result.written == 7);
  CHECK(b.result.rejected == 1);
  CHECK_THAT(b.result.first_reject, Catch::StartsWith(src.path() + "/caf\\xe9/empty\\t.png: "));

  // sources.tsv: one line per file, names escaped (sorted by raw bytes:
  // "back\\..." < "bad\xff" < "cr\r" < "empty\t" < "line\n" < "tab\t").
  const std::string tsv = ReadFile(cache + "/" + kSourcesTsvName);
  CHECK_THAT(tsv, Catch::Contains("\n0\tcaf\\xe9/back\\\\slash.png\t0\t") &&
                      Catch::Contains("\n1\tcaf\\xe9/bad\\xff.png\t0\t") &&
                      Catch::Contains("\n3\tcaf\\xe9/line\\nbreak.png\t0\t") &&
                      Catch::Contains("\n4\tcaf\\xe9/tab\\there.png\t0\t") &&
                      Catch::Contains("\n-1\tcaf\\xe9/empty\\t.png\t0\t"));
  CHECK(std::count(tsv.begin(), tsv.end(), '\n') == 1 + 8);
  const std::string rejects = ReadFile(cache + "/" + kRejectsName);
  CHECK(std::count(rejects.begin(), rejects.end(), '\n') == 2);
  CHECK_THAT(rejects, Catch::Contains("caf\\xe9/empty\\t.png\t"));

  // The manifest is valid JSON (UTF-8) and names the class escaped.
  Manifest m;
  REQUIRE(ReadManifest(cache, &m).ok());
  CHECK(m.classes == std::vector<std::string>{"caf\\xe9", "plain"});
  CHECK_NOTHROW(nlohmann::json::parse(ReadFile(cache + "/" + kManifestName)));

  // Verify finds each source again by its raw name; deep preprocesses them again.
  CHECK(Problems(cache) == "");
  CHECK(SourceProblems(cache, ingest::SourceCheck::kSources) == "");
  CHECK(SourceProblems(cache, ingest::SourceCheck::kDeep, 0) == "");
  b = Build(o);
  CHECK(b.result.up_to_date);

  // A changed file with such a name: named (escaped) in the report, whose JSON is valid.
  WriteFile(odd + "/tab\there.png", ReadFile(pngs[20]));
  VerifyReport r;
  REQUIRE(ingest::VerifyWithSources(cache, VerifyOptions(), ingest::SourceCheck::kSources, 0, 0,
                                    &r)
              .ok());
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].source == "caf\\xe9/tab\\there.png");
  CHECK_NOTHROW(nlohmann::json::parse(VerifyReportToJson(cache, r)));
}
