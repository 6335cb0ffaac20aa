// kiln merge: joins the parts of a cache built with --num-parts into one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "duplicate_report.h"
#include "journal.h"
#include "merge_records.h"
#include "core/file.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "sources_tsv.h"

namespace kiln::ingest {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Part {
  std::string dir;
  Manifest m;
  std::string shard_dir;          // where its (possibly re-indexed) shards are
  std::vector<ShardInfo> shards;  // with global indices in the merged cache
  int64_t delta = 0;              // merged index - part's own index
};

Status MergeOne(const std::string& out, std::vector<std::string> dirs, bool keep_parts,
                const std::function<void(const std::string&)>& info, MergeResult* result) {
  if (dirs.empty()) return Status::NotFound(out + ": no parts to merge (part-*-of-* directories)");
  std::vector<Part> parts;
  for (const std::string& d : dirs) {
    Part p;
    p.dir = d;
    Status s = ReadManifest(d, &p.m);
    if (s.IsIncomplete())
      return Status::Corruption(d +
                                ": this part's build did not finish; run its kiln build "
                                "command again to complete it, then merge");
    KILN_RETURN_IF_ERROR(s);
    if (!p.m.is_part())
      return Status::InvalidArgument(d + ": not a part of a cache built with --num-parts");
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.m.part_index < b.m.part_index; });
  const int n = parts[0].m.part_count;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    if (p.m.part_count != n)
      return Status::InvalidArgument(p.dir + ": part of " + std::to_string(p.m.part_count) +
                                     " parts, but " + parts[0].dir + " is part of " +
                                     std::to_string(n));
    if (i > 0 && p.m.part_index == parts[i - 1].m.part_index)
      return Status::InvalidArgument(p.dir + " and " + parts[i - 1].dir + " are both part " +
                                     std::to_string(p.m.part_index));
  }
  for (int i = 0; i < n; ++i) {
    if (i >= static_cast<int>(parts.size()) || parts[i].m.part_index != i)
      return Status::NotFound("part " + std::to_string(i) + " of " + std::to_string(n) +
                              " is missing (expected " + PartDirName(i, n) +
                              "); build it with --num-parts " + std::to_string(n) + " --part " +
                              std::to_string(i));
  }
  // All parts were made the same way, apart from their part number.
  auto without_part = [](Preprocessing p) {
    p.part_index = -1;
    p.part_count = 0;
    return p;
  };
  const Preprocessing pre = without_part(parts[0].m.preprocessing);
  for (const Part& p : parts) {
    const Preprocessing q = without_part(p.m.preprocessing);
    auto diff = PreprocessingDifferences(parts[0].m, p.m);
    if (p.m.classes != parts[0].m.classes) diff.push_back("classes differ");
    if (diff.empty() && q != pre) diff.push_back("sources or options differ");
    if (!diff.empty()) {
      std::string all;
      for (const auto& d : diff) all += (all.empty() ? "" : "; ") + d;
      return Status::InvalidArgument(p.dir + " was built differently from " + parts[0].dir + " (" +
                                     all + "): build every part with the same command");
    }
    KILN_RETURN_IF_ERROR(CheckInputQuick(p.dir, "rebuild this part"));
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (fs::exists(fs::path(out) / kManifestName))
    return Status::InvalidArgument(out +
                                   ": already holds a finished cache; merge into an empty "
                                   "directory (or the one holding only the parts)");

  // Global indices: each part continues where the parts before it ended.
  uint64_t next = 0;
  for (Part& p : parts) {
    p.delta = static_cast<int64_t>(next) - static_cast<int64_t>(p.m.first_index);
    if (p.delta == 0) {
      p.shard_dir = p.dir;
      p.shards = p.m.shards;
    } else {
      info(p.dir + ": starts at record " + std::to_string(p.m.first_index) +
           " but the parts before it hold " + std::to_string(next) +
           " (they rejected inputs): rewriting its " + std::to_string(p.m.count) +
           " records with new indices");
      p.shard_dir =
          (fs::path(out) / (kMergeScratchPrefix + PartDirName(p.m.part_index, n))).string();
      KILN_RETURN_IF_ERROR(RewriteRecords(p.dir, p.m, next, p.shard_dir, &p.shards));
      result->copied_records += p.m.count;
    }
    next += p.m.count;
  }

  // Shards, in order, as shard-00000.mdb, shard-00001.mdb, ...
  Manifest merged;
  merged.classes = parts[0].m.classes;
  merged.preprocessing = pre;
  merged.dtype = parts[0].m.dtype;
  merged.shape = parts[0].m.shape;
  // How the parts' shards were written (the same for every part of one
  // build): --repair rewrites a shard of the merged cache the same way.
  merged.initial_map_size = parts[0].m.initial_map_size;
  merged.commit_records = parts[0].m.commit_records;
  // Format 2: the parts' fields, each dim's largest size the largest any
  // part saw.
  merged.format_version = parts[0].m.format_version;
  merged.fields = parts[0].m.fields;
  for (const Part& p : parts) WidenMaxDims(p.m, &merged);
  merged.image_field = parts[0].m.image_field;
  merged.label_field = parts[0].m.label_field;
  merged.commit_bytes = parts[0].m.commit_bytes;
  merged.pack_bytes = parts[0].m.pack_bytes;
  merged.kiln_version = KilnVersion();
  merged.count = next;
  bool any_copied = false;
  for (const Part& p : parts)
    KILN_RETURN_IF_ERROR(LinkShards(p.shard_dir, p.shards, out, &merged, &any_copied));
  if (any_copied) info(out + ": the parts are on another file system: shards were copied");

  // sources.tsv: every part lists every source; the one that wrote a record says which.
  std::vector<RecordedSource> sources;
  bool have_sources = true;
  for (const Part& p : parts) {
    std::vector<RecordedSource> listed;
    Status s = ReadSourcesTsv(p.dir + "/" + kSourcesTsvName, &listed);
    if (s.IsNotFound()) {
      have_sources = false;
      break;
    }
    KILN_RETURN_IF_ERROR(s);
    if (&p == &parts[0]) {
      sources = listed;
      for (RecordedSource& r : sources) r.record = -1;
    }
    if (listed.size() != sources.size())
      return Status::Corruption(p.dir + "/" + kSourcesTsvName + ": lists " +
                                std::to_string(listed.size()) + " sources, " + parts[0].dir +
                                " lists " + std::to_string(sources.size()));
    for (size_t i = 0; i < listed.size(); ++i)
      if (listed[i].record >= 0) sources[i].record = listed[i].record + p.delta;
  }
  if (have_sources) KILN_RETURN_IF_ERROR(WriteSourcesTsv(out + "/" + kSourcesTsvName, sources));
  {
    // The parts' rejects in part order (a part of an older kiln: not retried).
    std::vector<RejectEntry> rejects;
    for (const Part& p : parts) {
      std::vector<RejectEntry> of_part;
      const Status s = ReadRejectsTsv(p.dir + "/" + kRejectsName, &of_part);
      if (!s.IsNotFound()) KILN_RETURN_IF_ERROR(s);
      rejects.insert(rejects.end(), of_part.begin(), of_part.end());
    }
    KILN_RETURN_IF_ERROR(WriteFileAtomic(out, kRejectsName, std::string(kRejectsName) + ".tmp",
                                         RejectsTsv(rejects)));
  }
  KILN_RETURN_IF_ERROR(RemoveUnlistedShards(out, merged));
  KILN_RETURN_IF_ERROR(WriteManifest(out, merged));

  for (const Part& p : parts) {
    if (p.shard_dir != p.dir) fs::remove_all(p.shard_dir, ec);
    if (!keep_parts) fs::remove_all(p.dir, ec);
  }
  result->caches.push_back(out);
  result->records += next;
  result->parts += n;
  result->shards += merged.shards.size();
  return Status::OK();
}

std::vector<std::string> FindParts(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && IsPartDirName(e.path().filename().string()))
      found.push_back(e.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

Status MergeParts(const std::string& out, const std::vector<std::string>& parts, bool keep_parts,
                  const std::function<void(const std::string&)>& info, MergeResult* result) {
  const auto t0 = std::chrono::steady_clock::now();
  MergeResult r;
  std::function<void(const std::string&)> say = info ? info : [](const std::string&) {};
  std::vector<SplitCache> merged;  // what the duplicate report covers
  std::error_code ec;
  fs::remove(out + "/" + kDuplicatesTsvName, ec);
  if (!parts.empty()) {
    KILN_RETURN_IF_ERROR(MergeOne(out, parts, keep_parts, say, &r));
    merged.push_back({"", out});
  } else {
    std::vector<std::string> here = FindParts(out);
    if (!here.empty()) {
      KILN_RETURN_IF_ERROR(MergeOne(out, here, keep_parts, say, &r));
      merged.push_back({"", out});
    } else {
      for (const std::string& split : SplitDirs()) {
        const std::string dir = out + "/" + split;
        std::vector<std::string> found = FindParts(dir);
        if (!found.empty()) KILN_RETURN_IF_ERROR(MergeOne(dir, found, keep_parts, say, &r));
      }
      if (r.caches.empty())
        return Status::NotFound(out +
                                ": no part-*-of-* directories here or in train/ and val/; "
                                "give the parts: kiln merge OUT PART...");
      // Both splits, when both are finished (one merged earlier counts).
      for (const std::string& split : SplitDirs())
        if (fs::exists(out + "/" + split + "/" + kManifestName, ec))
          merged.push_back({split, out + "/" + split});
    }
  }
  KILN_RETURN_IF_ERROR(ReportDuplicates(out, merged, 0, &r.duplicates));
  r.duplicates_file = out + "/" + kDuplicatesTsvName;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result) *result = std::move(r);
  return Status::OK();
}

}  // namespace kiln::ingest
