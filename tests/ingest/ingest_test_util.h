// Helpers of the tests that build caches from sample_data/: through the
// library (Build, Problems) in tests/ingest, through the kiln binary in
// tests/tools.
#ifndef KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_
#define KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_

#include <filesystem>
#include <map>
#include <string>

#include "kiln/cache_layout.h"
#include "kiln/ingest/build.h"
#include "kiln/verify.h"
#include "test_util.h"

namespace kiln::testing {

inline const std::string kFashion = std::string(KILN_SAMPLE_DATA) + "/fashion/train";
inline const std::string kPhotos = std::string(KILN_SAMPLE_DATA) + "/photos";

// An ImageFolder of `per_class` copies of each photo, in two classes.
inline void MakePhotoFolder(const std::string& root, int per_class) {
  int k = 0;
  for (const auto& e : std::filesystem::directory_iterator(kPhotos)) {
    for (int i = 0; i < per_class; ++i) {
      const std::string cls = (k++ % 2) ? "dogs" : "cats";
      std::filesystem::create_directories(root + "/" + cls);
      std::filesystem::copy_file(e.path(), root + "/" + cls + "/" + std::to_string(k) + "_" +
                                               e.path().filename().string());
    }
  }
}

// The bytes of a cache's shards and manifest, by file name.
inline std::map<std::string, std::string> CacheFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (IsShardFile(n) || n == kManifestName) files[n] = ReadFile(e.path().string());
  }
  return files;
}

// Build options for SRC -> OUT, the rest at their defaults.
inline ingest::BuildOptions BuildOf(const std::string& src, const std::string& out) {
  ingest::BuildOptions o;
  o.src = src;
  o.out = out;
  return o;
}

// One BuildCache call: its Status, its result and the lines it said.
struct Built {
  Status status;
  ingest::BuildResult result;
  std::string log;  // the info lines, each ending in '\n'
};

inline Built Build(const ingest::BuildOptions& o) {
  Built b;
  b.status = ingest::BuildCache(
      o, nullptr, [&b](const std::string& l) { b.log += l + "\n"; }, &b.result);
  return b;
}

// The report's problems, one a line, as "[record N] [(source)] [[shard]]: what".
inline std::string ProblemText(const VerifyReport& r) {
  std::string text;
  for (const VerifyProblem& p : r.problems) {
    if (p.index >= 0) text += "record " + std::to_string(p.index) + " ";
    if (!p.source.empty()) text += "(" + p.source + ") ";
    if (!p.shard.empty()) text += "[" + p.shard + "] ";
    text += ": " + p.what + "\n";
  }
  return text;
}

// What VerifyCache at `level` finds wrong in DIR: "" when it is intact (what
// `kiln verify` exits 0 on), else the failed Status or the problems.
inline std::string Problems(const std::string& dir, VerifyLevel level = VerifyLevel::kFull) {
  VerifyOptions o;
  o.level = level;
  VerifyReport r;
  const Status s = VerifyCache(dir, o, &r);
  return s.ok() ? ProblemText(r) : s.ToString();
}

// The same for VerifyWithSources (`kiln verify --level sources|deep`);
// `sample` 0 = every record.
inline std::string SourceProblems(const std::string& dir, ingest::SourceCheck check,
                                  uint64_t sample = 0) {
  VerifyReport r;
  const Status s = ingest::VerifyWithSources(dir, VerifyOptions(), check, sample, 0, &r);
  return s.ok() ? ProblemText(r) : s.ToString();
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_
