#include "repair.h"

#include <map>
#include <set>

#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "core/escape.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "sources_tsv.h"

namespace kiln::ingest {

Status RepairCache(const std::string& dir, const Preprocessing& recipe, const Preprocessor& pre,
                   int threads, const InfoFn& info, BuildResult* res) {
  res->caches.push_back(dir);
  Manifest m;
  Status s = ReadManifest(dir, &m);
  if (!s.ok())
    return Status::InvalidArgument(s.message() +
                                   "; --repair needs a finished cache (run the "
                                   "build without --repair to resume or rebuild it)");
  // Records are rewritten in the format 1 layout only (RewriteRecords):
  // refused before anything is verified or reprocessed.
  if (m.format_version != kFormatVersion)
    return Status::NotSupported(dir +
                                ": --repair of a format 2 cache (whole images, several "
                                "labels or float targets) is not supported yet: rebuild it with "
                                "--force");
  if (m.preprocessing != recipe)
    return Status::InvalidArgument(dir +
                                   ": --repair needs the original build's sources and "
                                   "arguments; they differ (" +
                                   RecipeChanges(m.preprocessing, recipe) + ")");
  VerifyReport rep;
  VerifyOptions vo;
  vo.threads = threads;
  KILN_RETURN_IF_ERROR(VerifyCache(dir, vo, &rep));
  std::set<uint64_t> bad;
  for (const VerifyProblem& p : rep.problems) {
    using Kind = VerifyProblem::Kind;
    // A record count, size or digest that is off follows from records
    // damaged or deleted; the shards holding them are rewritten.
    if (p.kind == Kind::kShardMismatch) continue;
    if (p.kind != Kind::kRecord || p.index < 0)
      return Status::Corruption(
          dir + ": cannot repair record by record: " + (p.shard.empty() ? "" : p.shard + ": ") +
          p.what + "; rebuild with --force");
    bad.insert(static_cast<uint64_t>(p.index));
  }
  if (bad.empty() && !rep.clean())
    return Status::Corruption(dir + ": no single record is at fault (" + rep.problems[0].what +
                              "); rebuild with --force");
  if (bad.empty()) {
    info(dir + ": verified clean, nothing to repair");
    res->up_to_date = true;
    return Status::OK();
  }
  std::vector<RecordedSource> recorded;
  KILN_RETURN_IF_ERROR(ReadSourcesTsv(dir + "/" + kSourcesTsvName, &recorded));
  std::map<int64_t, const RecordedSource*> by_record;
  for (const auto& r : recorded)
    if (r.record >= 0) by_record[r.record] = &r;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<RecordFix> fixes;
  payloads.reserve(bad.size());
  Preprocessor::Scratch scratch;
  for (uint64_t idx : bad) {
    auto it = by_record.find(static_cast<int64_t>(idx));
    if (it == by_record.end())
      return Status::Corruption(dir + ": record " + std::to_string(idx) +
                                " has no source in sources.tsv; rebuild with --force");
    const SourceItem& item = it->second->item;
    payloads.emplace_back(pre.record_bytes());
    KILN_RETURN_IF_ERROR(pre.Process(RawName(recipe.source.root), item, &scratch, payloads.back().data())
                             .WithContext("repairing record " + std::to_string(idx) + " from " +
                                          recipe.source.root + "/" + EscapeName(item.rel_path)));
    fixes.push_back({idx, item.label, payloads.back().data()});
  }
  KILN_RETURN_IF_ERROR(RewriteRecords(dir, fixes));
  KILN_RETURN_IF_ERROR(VerifyCache(dir, vo, &rep));
  if (!rep.clean())
    return Status::Corruption(dir + ": still damaged after repair: " + rep.problems[0].what);
  std::string list;
  for (uint64_t idx : bad) list += (list.empty() ? "" : ", ") + std::to_string(idx);
  info(dir + ": repaired " + std::to_string(bad.size()) + " record(s) from their sources: " + list +
       "; the cache verifies clean");
  res->written += bad.size();
  return Status::OK();
}

}  // namespace kiln::ingest
