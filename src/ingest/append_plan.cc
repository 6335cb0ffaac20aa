#include "append_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/escape.h"
#include "kiln/cache_layout.h"

namespace kiln::ingest {

Status SettlePendingLists(const std::string& dir, const Manifest& m) {
  const std::string sources = dir + "/" + kPendingSources, rejects = dir + "/" + kPendingRejects;
  struct stat st;
  if (::stat(sources.c_str(), &st) != 0 && ::stat(rejects.c_str(), &st) != 0)
    return Status::OK();
  // The append that wrote them published its manifest unless its marker
  // still names this manifest's count.
  bool published = true;
  std::ifstream marker(dir + "/" + kAppendMarkerName);
  if (marker) {
    const nlohmann::json j = nlohmann::json::parse(marker, nullptr, false);
    published = !(j.is_object() && j.contains("count_before") &&
                  j["count_before"].is_number_unsigned() &&
                  j["count_before"].get<uint64_t>() == m.count);
  }
  for (const auto& [pending, name] : {std::pair{sources, std::string(kSourcesTsvName)},
                                      std::pair{rejects, std::string(kRejectsName)}}) {
    if (::stat(pending.c_str(), &st) != 0) continue;
    if (!published) {
      ::unlink(pending.c_str());
    } else if (::rename(pending.c_str(), (dir + "/" + name).c_str()) != 0) {
      return Status::IOError(pending + ": cannot rename it to " + name + ": " +
                             std::strerror(errno));
    }
  }
  if (published) ::unlink((dir + "/" + kAppendMarkerName).c_str());
  return Status::OK();
}

Status PlanAppend(const std::string& dir, const SourceList& src, AppendPlan* out) {
  *out = AppendPlan();
  const Status read = ReadManifest(dir, &out->base);
  if (read.IsIncomplete() || read.IsNotFound())
    return Status::InvalidArgument(dir + ": holds no finished cache to append to (" +
                                   read.message() + "); build it first, without --append");
  KILN_RETURN_IF_ERROR(read);
  KILN_RETURN_IF_ERROR(SettlePendingLists(dir, out->base));
  const std::string tsv = dir + "/" + kSourcesTsvName;
  const Status listed = ReadSourcesTsv(tsv, &out->recorded);
  // A merge of finished caches (kiln merge --from) came from several trees.
  if (listed.IsNotFound() &&
      nlohmann::json::parse(out->base.preprocessing.ToJson(), nullptr, false).contains("merged"))
    return Status::InvalidArgument(
        dir + ": a merge of several caches (kiln merge --from), not one source tree's: "
              "append the new files to the cache of their own tree (kiln build --append), then "
              "merge again");
  if (listed.IsNotFound())
    return Status::InvalidArgument(tsv + ": missing, so the sources the cache holds are not "
                                         "known: --append needs a cache made by kiln build");
  KILN_RETURN_IF_ERROR(listed);
  std::unordered_map<std::string, size_t> known;
  for (size_t i = 0; i < out->recorded.size(); ++i) known[out->recorded[i].item.rel_path] = i;
  std::vector<bool> seen(out->recorded.size(), false);
  for (size_t p = 0; p < src.items.size(); ++p) {
    const SourceItem& it = src.items[p];
    const auto k = known.find(it.rel_path);
    if (k == known.end()) {
      out->added.push_back(p);
      continue;
    }
    const SourceItem& was = out->recorded[k->second].item;
    seen[k->second] = true;
    if (was.size != it.size || was.mtime_ns != it.mtime_ns)
      return Status::InvalidArgument(
          src.root + "/" + it.rel_path + ": changed since the cache was built (size " +
          std::to_string(was.size) + " -> " + std::to_string(it.size) +
          (was.mtime_ns != it.mtime_ns ? ", modified" : "") +
          "): --append only adds new files; rebuild the cache (--rebuild-if-changed)");
  }
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      return Status::InvalidArgument(
          src.root + "/" + out->recorded[i].item.rel_path +
          ": in the cache's sources but no longer among the sources: --append only adds new "
          "files; rebuild the cache (--rebuild-if-changed)");
  return Status::OK();
}

void AppendClasses(const std::vector<std::string>& base, const std::vector<size_t>& added,
                   SourceList* src) {
  std::vector<std::string> merged;
  std::map<std::string, int64_t> index;
  for (const std::string& c : base) {
    index.emplace(RawName(c), static_cast<int64_t>(merged.size()));
    merged.push_back(RawName(c));
  }
  const std::vector<std::string> listed = src->classes;
  auto relabel = [&](int64_t label) -> int64_t {
    if (label < 0 || label >= static_cast<int64_t>(listed.size())) return label;
    const auto [at, fresh] = index.emplace(listed[label], static_cast<int64_t>(merged.size()));
    if (fresh) merged.push_back(listed[label]);
    return at->second;
  };
  for (size_t p : added) {
    SourceItem& it = src->items[p];
    it.label = relabel(it.label);
    for (int64_t& l : it.labels) l = relabel(l);
  }
  src->classes = merged;
}

std::vector<RecordedSource> AppendedSources(const AppendPlan& plan, const SourceList& src,
                                            const std::vector<size_t>& order, uint64_t first,
                                            const std::vector<bool>& rejected) {
  std::vector<RecordedSource> out(src.items.size());
  std::unordered_map<std::string, size_t> known;
  for (size_t i = 0; i < plan.recorded.size(); ++i) known[plan.recorded[i].item.rel_path] = i;
  for (size_t i = 0; i < src.items.size(); ++i) {
    // A recorded source as recorded (its label is the cache's), a new one as listed.
    const auto k = known.find(src.items[i].rel_path);
    if (k != known.end()) {
      out[i] = plan.recorded[k->second];
    } else {
      out[i].item = src.items[i];
      out[i].record = -1;
    }
  }
  int64_t next = static_cast<int64_t>(first);
  for (size_t k = 0; k < order.size(); ++k)
    if (!rejected[k]) out[order[k]].record = next++;
  return out;
}

}  // namespace kiln::ingest
