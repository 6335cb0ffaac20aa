#include "repair.h"

#include <map>
#include <set>

#include "core/escape.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "pipeline.h"
#include "sources_tsv.h"

namespace kiln::ingest {

Status RepairCache(const std::string& dir, const SourceList& src, const Preprocessing& recipe,
                   const Preprocessor& pre, int threads, const InfoFn& info, BuildResult* res) {
  res->caches.push_back(dir);
  Manifest m;
  Status s = ReadManifest(dir, &m);
  if (!s.ok())
    return Status::InvalidArgument(s.message() +
                                   "; --repair needs a finished cache (run the "
                                   "build without --repair to resume or rebuild it)");
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
  // Format 2: every field made again as the build made it
  // (BuildRecordFields), from the listing's item - it holds the labels and
  // targets of a CSV, which sources.tsv does not.
  const bool v2 = m.format_version == kFormatVersion2;
  std::vector<RemadeRecord> made(bad.size());
  std::vector<RecordFix> fixes;
  Preprocessor::Scratch scratch;
  for (uint64_t idx : bad) {
    auto it = by_record.find(static_cast<int64_t>(idx));
    if (it == by_record.end())
      return Status::Corruption(dir + ": record " + std::to_string(idx) +
                                " has no source in sources.tsv; rebuild with --force");
    const SourceItem* item = &it->second->item;
    const std::string where = "repairing record " + std::to_string(idx) + " from " +
                              recipe.source.root + "/" + EscapeName(item->rel_path);
    RemadeRecord& out = made[fixes.size()];
    RecordFix fix;
    fix.index = idx;
    if (v2) {
      const SourceItem* listed = FindSource(src, item->rel_path);
      if (listed == nullptr)
        return Status::Corruption(dir + ": record " + std::to_string(idx) + "'s source " +
                                  EscapeName(item->rel_path) +
                                  " is no longer listed; rebuild with --force");
      item = listed;
      KILN_RETURN_IF_ERROR(RemakeRecord(src, pre, *item, &scratch, &out).WithContext(where));
      fix.fields.assign(out.fields, out.fields + out.num_fields);
    } else {
      out.image.resize(pre.record_bytes());
      KILN_RETURN_IF_ERROR(
          pre.Process(RawName(recipe.source.root), *item, &scratch, out.image.data())
              .WithContext(where));
      fix.label = item->label;
      fix.payload = out.image.data();
    }
    fixes.push_back(std::move(fix));
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
