// kiln verify --level sources|deep: the checks that need the sources.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/escape.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "kiln/shuffle.h"
#include "kiln/verify.h"
#include "pipeline.h"
#include "preprocessor.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

const char* SourceCheckName(SourceCheck check) {
  return check == SourceCheck::kDeep ? "deep" : "sources";
}

Status ParseSourceCheck(const std::string& name, SourceCheck* out) {
  for (SourceCheck c : {SourceCheck::kSources, SourceCheck::kDeep})
    if (name == SourceCheckName(c)) {
      *out = c;
      return Status::OK();
    }
  return Status::InvalidArgument("unknown source check '" + name + "' (expected sources or deep)");
}

// The name of the first field of record `v` that differs from `made`
// (dtype, shape or bytes); "" when they are equal.
static std::string FirstFieldDifference(const Manifest& m, const RecordView& v,
                                        const RemadeRecord& made) {
  for (int f = 0; f < v.num_fields; ++f) {
    if (f >= made.num_fields) return m.fields[f].name;
    const FieldView& have = v.fields[f];
    const FieldData& want = made.fields[f];
    const uint64_t bytes = FieldPayloadBytes(want);
    if (have.dtype != want.dtype || have.shape != want.shape || have.codec != want.codec ||
        have.bytes != bytes ||
        (bytes > 0 && std::memcmp(have.data, want.data, bytes) != 0))
      return m.fields[f].name;
  }
  return made.num_fields > v.num_fields ? "field count" : "";
}

Status VerifyWithSources(const std::string& dir, const VerifyOptions& options, SourceCheck check,
                         uint64_t sample, uint64_t seed, VerifyReport* report) {
  VerifyOptions core = options;
  core.level = VerifyLevel::kFull;
  KILN_RETURN_IF_ERROR(VerifyCache(dir, core, report));
  report->level = SourceCheckName(check);
  const auto t0 = std::chrono::steady_clock::now();
  using Kind = VerifyProblem::Kind;
  auto problem = [&](int64_t index, const std::string& source, const std::string& what,
                     Kind kind = Kind::kSource) {
    report->problems.push_back({index, "", EscapeName(source), what, kind});
  };
  Manifest m;
  if (!ReadManifest(dir, &m).ok()) return Status::OK();  // already reported
  std::vector<RecordedSource> recorded;
  Status s = ReadSourcesTsv(dir + "/" + kSourcesTsvName, &recorded);
  if (!s.ok()) {
    problem(-1, "", s.message() + "; cannot compare with the sources");
    return Status::OK();
  }
  std::map<std::string, const RecordedSource*> by_path;
  std::map<int64_t, const RecordedSource*> by_record;
  for (const auto& r : recorded) {
    by_path[r.item.rel_path] = &r;
    if (r.record >= 0) by_record[r.record] = &r;
  }
  // Name the source of every record-level problem found so far.
  for (auto& p : report->problems)
    if (p.index >= 0 && by_record.count(p.index) && p.source.empty())
      p.source = EscapeName(by_record[p.index]->item.rel_path);

  Preprocessor pre;
  s = Preprocessor::FromManifestRecipe(m.preprocessing, m.shape, &pre);
  if (!s.ok()) {
    problem(-1, "", s.message());
    return Status::OK();
  }
  // The build did not list its own OUT (it may lie inside the sources):
  // DIR, or the folder above its split or part.
  fs::path out = fs::absolute(dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (m.is_part()) out = out.parent_path();
  if (!m.preprocessing.split.empty()) out = out.parent_path();
  SourceList now;
  s = ListSources(RawName(m.preprocessing.source.root), RawName(m.preprocessing.source.list_file),
                  &now, out.string());
  if (!s.ok()) {
    problem(-1, "", "cannot list the sources again: " + s.message());
    return Status::OK();
  }
  const size_t problems_before = report->problems.size();
  std::set<std::string> seen;
  for (const SourceItem& it : now.items) {
    seen.insert(it.rel_path);
    auto f = by_path.find(it.rel_path);
    if (f == by_path.end()) {
      problem(-1, it.rel_path, "source file added since the build (the cache is stale)");
    } else if (f->second->item.size != it.size || f->second->item.mtime_ns != it.mtime_ns ||
               f->second->item.label != it.label) {
      problem(f->second->record, it.rel_path,
              "source file changed since the build (size, mtime or label; the cache is stale)");
    }
  }
  for (const auto& r : recorded)
    if (!seen.count(r.item.rel_path))
      problem(r.record, r.item.rel_path,
              "source file removed since the build (the cache is stale)");
  // A CSV's several labels and float targets are not in sources.tsv: the
  // listing's digest covers them. Said only when no file was found changed
  // above (a changed file changes the digest too).
  const bool files_changed = report->problems.size() > problems_before;
  if (!files_changed && (now.multi_label || !now.target_names.empty()) &&
      SourceDigest(now) != m.preprocessing.source.digest)
    problem(-1, m.preprocessing.source.list_file,
            "the list's labels or targets changed since the build (the cache is stale)");
  // --masks: the mask files as a whole (sources.tsv lists only the images).
  const std::string& masks_digest = m.preprocessing.source.masks_digest;
  if (!masks_digest.empty() && MasksDigest(now, RawName(m.preprocessing.masks)) != masks_digest)
    problem(-1, m.preprocessing.masks,
            "mask files added, removed or changed since the build (the cache is stale)");

  if (check == SourceCheck::kDeep && !by_record.empty()) {
    std::vector<int64_t> all;
    for (const auto& kv : by_record) all.push_back(kv.first);
    std::vector<int64_t> records;
    for (size_t k : SeededSample(all.size(), sample, seed)) records.push_back(all[k]);
    std::unique_ptr<CacheReader> reader;
    s = CacheReader::Open(dir, ReaderOptions(), &reader);
    if (s.ok()) {
      auto txn = reader->BeginRead();
      std::vector<uint8_t> buf(pre.record_bytes());
      Preprocessor::Scratch scratch;
      RemadeRecord made;
      for (int64_t rec : records) {
        const SourceItem& it = by_record[rec]->item;
        RecordView v;
        if (!txn->Get(static_cast<uint64_t>(rec), &v).ok()) continue;  // reported by full
        if (m.format_version == kFormatVersion2) {
          // Every field, made as the build made it, from today's listing
          // (a CSV's labels and targets are not in sources.tsv).
          const SourceItem* listed = FindSource(now, it.rel_path);
          if (listed == nullptr) continue;  // removed (reported above)
          Status ps = RemakeRecord(now, pre, *listed, &scratch, &made);
          if (!ps.ok()) {
            problem(rec, it.rel_path, "cannot preprocess the source again: " + ps.message());
            continue;
          }
          const std::string differs = FirstFieldDifference(m, v, made);
          if (!differs.empty())
            problem(rec, it.rel_path,
                    "preprocessing the source again gives a different '" + differs +
                        "' than the record",
                    Kind::kRecord);
          continue;
        }
        Shape shape = v.shape;
        Status ps = pre.whole() ? pre.TryProcessWhole(RawName(m.preprocessing.source.root), it,
                                                      &scratch, &buf, &shape)
                                : pre.Process(RawName(m.preprocessing.source.root), it, &scratch,
                                              buf.data());
        if (!ps.ok()) {
          problem(rec, it.rel_path, "cannot preprocess the source again: " + ps.message());
        } else if (v.bytes != buf.size() || shape != v.shape ||
                   std::memcmp(v.data, buf.data(), buf.size()) != 0) {
          problem(rec, it.rel_path,
                  "preprocessing the source again gives different bytes than the record",
                  Kind::kRecord);
        }
      }
    }
  }
  std::stable_sort(
      report->problems.begin(), report->problems.end(),
      [](const VerifyProblem& a, const VerifyProblem& b) { return a.index < b.index; });
  report->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace kiln::ingest
