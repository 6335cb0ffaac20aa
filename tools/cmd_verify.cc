// kiln verify CACHE: proves a cache intact and complete.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "kiln/duplicates.h"
#include "core/units.h"
#include "kiln/verify.h"
#include "progress_printer.h"

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
  std::string against;  // another cache: report the records of CACHE also in it
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
    std::cout << " in " << FormatDuration(r.seconds);
    if (r.seconds > 0 && r.bytes_checked)
      std::cout << " (" << FormatByteRate(static_cast<double>(r.bytes_checked), r.seconds) << ")";
    std::cout << "\n";
    for (const VerifyProblem& p : r.problems) {
      std::cout << "  PROBLEM";
      if (p.index >= 0) std::cout << " record " << p.index;
      if (!p.shard.empty()) std::cout << " [" << p.shard << "]";
      if (!p.source.empty()) std::cout << " (" << p.source << ")";
      std::cout << ": " << p.what << "\n";
    }
    for (const std::string& n : r.notes) std::cout << "  NOTE: " << n << "\n";
    std::cout << (r.clean() ? "OK: the cache is intact\n"
                            : "FAILED: " + std::to_string(r.problems.size()) +
                                  " problem(s); rebuild the cache (kiln build --force)\n");
  }
  return r.clean() ? kExitOk : kExitBadData;
}

// --against OTHER: the records of a.dir whose pixels are also in OTHER
// (a val cache against the train cache built separately). Exit 1 when some
// are; a usage error when the two caches' records cannot be compared.
int CheckAgainst(const VerifyArgs& a, nlohmann::json* doc) {
  std::unique_ptr<CacheReader> mine, other;
  Status s = CacheReader::Open(a.dir, ReaderOptions(), &mine);
  if (s.ok()) s = CacheReader::Open(a.against, ReaderOptions(), &other);
  if (!s.ok()) return ReportError("verify", s);
  const Manifest &m = mine->manifest(), &o = other->manifest();
  auto recipe = [](const Manifest& x) {
    std::string r = std::string(DTypeName(x.dtype)) + " " + x.shape.ToString();
    if (x.dtype != DType::kUint8) {
      r += " mean";
      for (double v : x.preprocessing.mean) r += " " + std::to_string(v);
      r += " std";
      for (double v : x.preprocessing.std) r += " " + std::to_string(v);
    }
    return r;
  };
  if (recipe(m) != recipe(o))
    return ReportError("verify",
                       Status::InvalidArgument(
                           "--against " + a.against + ": its records (" + recipe(o) +
                           ") cannot be compared with those of " + a.dir + " (" + recipe(m) +
                           "): overlap is found between caches built with the same dtype, size "
                           "and normalization"));
  std::vector<std::vector<RecordPrint>> prints(2);
  s = FingerprintCache(*mine, a.threads, &prints[0]);
  if (s.ok()) s = FingerprintCache(*other, a.threads, &prints[1]);
  if (!s.ok()) return ReportError("verify", s);
  const std::vector<DuplicateGroup> groups = FindDuplicates(prints);
  const DuplicateCounts c = CountDuplicates(groups, 0, 1);
  // Each record of a.dir found in OTHER, with the first OTHER record it equals.
  nlohmann::json pairs = nlohmann::json::array();
  for (const DuplicateGroup& g : groups) {
    if (!g.spans(0, 1)) continue;
    uint64_t theirs = 0;
    for (const DuplicateMember& x : g.members)
      if (x.cache == 1) {
        theirs = x.record;
        break;
      }
    for (const DuplicateMember& x : g.members)
      if (x.cache == 0) pairs.push_back({{"record", x.record}, {"other_record", theirs}});
  }
  if (doc != nullptr) {
    (*doc)["against"] = {{"cache", a.against}, {"overlap", c.overlap}, {"records", pairs}};
  } else {
    std::cout << "against " << a.against << ": " << c.overlap << " of " << mine->size()
              << " records are also in it\n";
    for (size_t i = 0; i < pairs.size() && i < 10; ++i)
      std::cout << "  record " << pairs[i]["record"].get<uint64_t>() << " = record "
                << pairs[i]["other_record"].get<uint64_t>() << " of " << a.against << "\n";
    if (pairs.size() > 10) std::cout << "  ... and " << pairs.size() - 10 << " more (--json lists all)\n";
    if (c.overlap > 0)
      std::cout << "FAILED: " << c.overlap << " record(s) of " << a.dir << " are in "
                << a.against
                << ": a model trained on it is validated on images it has seen; build both "
                   "splits from one source tree with kiln build --val-fraction, or remove them\n";
  }
  return c.overlap > 0 ? kExitBadData : kExitOk;
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
  if (!a.against.empty()) {
    if (!splits.empty())
      return ReportError("verify", Status::InvalidArgument(
                                       "--against compares one cache with another: give " +
                                       (fs::path(a.dir) / SplitDirs()[1]).string() + " --against " +
                                       (fs::path(a.dir) / SplitDirs()[0]).string()));
    std::string text;
    const int rc = VerifyOne(a, a.json ? &text : nullptr);
    if (rc != kExitOk) {
      if (a.json) std::cout << text;
      return rc;
    }
    if (!a.json) return CheckAgainst(a, nullptr);
    nlohmann::json doc = nlohmann::json::parse(text);
    const int overlap = CheckAgainst(a, &doc);
    if (overlap == kExitUsage) return overlap;
    std::cout << doc.dump(2) << "\n";
    return overlap;
  }
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
                       sub->add_option("--against", a->against,
                                       "another cache (the train split of a val cache): "
                                       "report records with the same pixels in both (exit 1)");
                       sub->add_flag("--json", a->json, "print the report as one JSON document");
                       sub->add_option("--threads", a->threads, "worker threads (0 = all cores)");
                       sub->add_option("--progress", a->progress,
                                       "auto | tty | plain | json | none (on stderr)");
                       AddExamples(sub, {"kiln verify OUT", "kiln verify OUT --level deep "
                                                                "--sample 100 --json",
                                          "kiln verify VAL --against TRAIN"});
                       return [a] { return RunVerify(*a); };
                     }});

}  // namespace
}  // namespace kiln::tools
