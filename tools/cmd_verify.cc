// kiln verify CACHE: proves a cache intact and complete.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "progress_printer.h"
#include "kiln/cache_layout.h"
#include "kiln/verify.h"

namespace kiln::tools {
namespace {

struct VerifyArgs {
  std::string dir;
  std::string level = "full";
  bool json = false;
  int threads = 0;
  uint64_t sample = 64;
  uint64_t seed = 0;
  std::string progress = "auto";
};

// Verifies one cache; with --json its report goes to *json_out if given.
int VerifyOne(const VerifyArgs& a, std::string* json_out = nullptr) {
  VerifyOptions o;
  const bool sources = a.level == "sources" || a.level == "deep";
  Status s = sources ? Status::OK() : ParseVerifyLevel(a.level, &o.level);
  if (!s.ok())
    return ReportError("verify", Status::InvalidArgument("--level " + a.level +
                                                         ": expected quick, full, sources or deep"));
  o.threads = a.threads;
  ProgressPrinter print;
  s = MakeProgressPrinter("verify", "records", a.progress, &print);
  if (!s.ok()) return ReportError("verify", s);
  if (print) o.progress = [print, dir = a.dir](const Progress& p) { print(dir, p); };
  VerifyReport r;
  if (sources) {
    s = VerifySources(a.dir, a.level, o, a.sample, a.seed, &r);
  } else {
    s = VerifyCache(a.dir, o, &r);
  }
  if (!s.ok()) return ReportError("verify", s);
  if (a.json) {
    const std::string doc = VerifyReportToJson(a.dir, r);
    if (json_out != nullptr) *json_out = doc;
    else std::cout << doc;
  } else {
    std::cout << "kiln verify " << a.dir << " (level " << r.level << "): "
              << r.records_checked << " records";
    if (r.bytes_checked)
      std::cout << ", " << HumanBytes(static_cast<double>(r.bytes_checked)) << " checksummed";
    std::cout << " in " << r.seconds << " s";
    if (r.seconds > 0 && r.bytes_checked)
      std::cout << " (" << HumanBytes(r.bytes_checked / r.seconds) << "/s)";
    std::cout << "\n";
    for (const VerifyProblem& p : r.problems) {
      std::cout << "  PROBLEM";
      if (p.index >= 0) std::cout << " record " << p.index;
      if (!p.shard.empty()) std::cout << " [" << p.shard << "]";
      if (!p.source.empty()) std::cout << " (" << p.source << ")";
      std::cout << ": " << p.what << "\n";
    }
    std::cout << (r.clean() ? "OK: the cache is intact\n"
                            : "FAILED: " + std::to_string(r.problems.size()) +
                                  " problem(s); rebuild the cache (kiln build --force)\n");
  }
  return r.clean() ? kExitOk : kExitBadData;
}

// `kiln build --val-fraction` writes OUT/train and OUT/val: `kiln verify
// OUT` checks both (with --json: {"splits": {"train": ..., "val": ...}}).
int RunVerify(const VerifyArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool cache = fs::exists(fs::path(a.dir) / kManifestName, ec) ||
                     fs::exists(fs::path(a.dir) / kBuildStateName, ec) ||
                     !fs::is_directory(a.dir, ec);
  std::vector<std::string> splits;
  for (const std::string& split : SplitDirs())
    if (!cache && fs::is_directory(fs::path(a.dir) / split, ec)) splits.push_back(split);
  if (splits.empty()) return VerifyOne(a);
  int rc = kExitOk;
  nlohmann::json docs = nlohmann::json::object();
  for (const std::string& split : splits) {
    VerifyArgs one = a;
    one.dir = (fs::path(a.dir) / split).string();
    std::string doc;
    rc = std::max(rc, VerifyOne(one, &doc));
    if (a.json && !doc.empty()) docs[split] = nlohmann::json::parse(doc);
  }
  if (a.json) std::cout << nlohmann::json{{"splits", docs}}.dump(2) << "\n";
  return rc;
}

KILN_COMMAND(Command{"verify", "Check a cache: manifest, shards, headers, checksums, sources", 20,
                     [](CLI::App* sub) -> std::function<int()> {
                       auto a = std::make_shared<VerifyArgs>();
                       sub->add_option("CACHE", a->dir, "cache directory")->required();
                       sub->add_option("--level", a->level,
                                       "quick | full (default) | sources | deep");
                       sub->add_option("--sample", a->sample,
                                       "deep: records preprocessed again (default 64, 0 = all)");
                       sub->add_option("--seed", a->seed, "deep: seed of the sample");
                       sub->add_flag("--json", a->json, "print the report as one JSON document");
                       sub->add_option("--threads", a->threads, "worker threads (0 = all cores)");
                       sub->add_option("--progress", a->progress,
                                       "auto | tty | plain | json | none (on stderr)");
                       AddExamples(sub, {"kiln verify OUT", "kiln verify OUT --level deep "
                                                                "--sample 100 --json"});
                       return [a] { return RunVerify(*a); };
                     }});

}  // namespace
}  // namespace kiln::tools
