// kiln merge --from A --from B OUT: one cache of the records of finished
// caches with the same fields and recipe, in the order given.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "duplicate_report.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "merge_records.h"

namespace kiln::ingest {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Input {
  std::string dir;  // absolute
  Manifest m;
  std::vector<int64_t> label_map;  // its label -> the merged cache's; empty: the same
  std::vector<ShardInfo> shards;   // with indices in the merged cache
  uint64_t first = 0;              // its first record's index in the merged cache
};

std::string Joined(const std::vector<std::string>& parts) {
  std::string all;
  for (const auto& d : parts) all += (all.empty() ? "" : "; ") + d;
  return all;
}

// What keeps the records of `b` from joining those of `a` in one cache:
// their fields (names, dtypes, shapes, codecs, the label field) and, for
// the tensors, the recipe (PreprocessingDifferences, and the split).
std::vector<std::string> Conflicts(const Manifest& a, const Manifest& b) {
  std::vector<std::string> out = PreprocessingDifferences(a, b);
  if (a.format_version != b.format_version)
    out.push_back("format " + std::to_string(a.format_version) + " vs " +
                  std::to_string(b.format_version));
  if (a.fields.size() == b.fields.size())
    for (size_t f = 0; f < a.fields.size(); ++f)
      if (a.fields[f].codec != b.fields[f].codec)
        out.push_back("field " + a.fields[f].name + "'s codec: " + CodecName(a.fields[f].codec) +
                      " vs " + CodecName(b.fields[f].codec));
  auto label_name = [](const Manifest& m) {
    return m.label_field >= 0 ? m.fields[m.label_field].name : std::string("none");
  };
  if (label_name(a) != label_name(b))
    out.push_back("label field: " + label_name(a) + " vs " + label_name(b));
  if (a.preprocessing.complete != b.preprocessing.complete)
    out.push_back(std::string("recipe: ") +
                  (a.preprocessing.complete ? "kiln build's" : "another writer's") + " vs " +
                  (b.preprocessing.complete ? "kiln build's" : "another writer's"));
  else if (a.preprocessing.split != b.preprocessing.split)
    out.push_back("split: \"" + a.preprocessing.split + "\" vs \"" + b.preprocessing.split + "\"");
  return out;
}

// The merged cache's recipe: the first cache's, with "merged" listing
// where every later cache's records came from (so that a build of the
// first cache's sources no longer finds the merged cache up to date).
Status MergedRecipe(const std::vector<Input>& in, Preprocessing* out) {
  json recipe = json::parse(in[0].m.preprocessing.ToJson());
  json merged = recipe.contains("merged") ? recipe["merged"] : json::array();
  for (size_t i = 1; i < in.size(); ++i) {
    const json p = json::parse(in[i].m.preprocessing.ToJson());
    json entry = {{"cache", in[i].dir}, {"records", in[i].m.count}};
    if (p.contains("source")) entry["source"] = p["source"];
    if (p.contains("dataset")) entry["dataset"] = p["dataset"];
    merged.push_back(entry);
    if (p.contains("merged"))
      for (const json& e : p["merged"]) merged.push_back(e);
  }
  recipe["merged"] = merged;
  return Preprocessing::FromJson(recipe.dump(), "the merged recipe", out);
}

Status ReadInputs(const std::vector<std::string>& from, const std::string& out,
                  std::vector<Input>* inputs) {
  std::error_code ec;
  for (const std::string& d : from) {
    Input in;
    in.dir = fs::absolute(d, ec).lexically_normal().string();
    if (!in.dir.empty() && in.dir.back() == '/') in.dir.pop_back();
    Status s = ReadManifest(in.dir, &in.m);
    if (s.IsIncomplete())
      return Status::InvalidArgument(d +
                                     ": not a finished cache (no manifest.json); finish its "
                                     "build, or give a finished cache");
    if (s.IsNotFound()) return Status::NotFound(d + ": no such cache");
    KILN_RETURN_IF_ERROR(s);
    if (in.m.is_part())
      return Status::InvalidArgument(d + ": is part " + std::to_string(in.m.part_index) + " of " +
                                     std::to_string(in.m.part_count) +
                                     " of a cache built in parts; join the parts with kiln merge "
                                     "OUT [PART...], then merge the caches");
    if (fs::equivalent(in.dir, out, ec))
      return Status::InvalidArgument(d + ": is OUT itself; merge into a new directory");
    for (const Input& e : *inputs)
      if (fs::equivalent(e.dir, in.dir, ec))
        return Status::InvalidArgument(d + ": given twice (as " + e.dir + ")");
    inputs->push_back(std::move(in));
  }
  return Status::OK();
}

// Classes by name: the first cache's in order, then each later cache's
// names not seen yet, in its order. Sets each input's label_map.
Status ReconcileClasses(std::vector<Input>* in, std::vector<std::string>* classes) {
  *classes = (*in)[0].m.classes;
  for (Input& x : *in) {
    const bool named = !x.m.classes.empty();
    const bool labelled = x.m.label_field >= 0 && x.m.count > 0;
    if (labelled && !named && !classes->empty())
      return Status::InvalidArgument(x.dir +
                                     ": its labels have no class names, so they cannot be "
                                     "matched with " + (*in)[0].dir +
                                     "'s by name; write it with classes");
    if (named && classes->empty() && (*in)[0].m.label_field >= 0 && (*in)[0].m.count > 0)
      return Status::InvalidArgument((*in)[0].dir +
                                     ": its labels have no class names, so they cannot be "
                                     "matched with " + x.dir + "'s by name; write it with classes");
    bool identity = true;
    std::vector<int64_t> map;
    for (size_t l = 0; l < x.m.classes.size(); ++l) {
      auto it = std::find(classes->begin(), classes->end(), x.m.classes[l]);
      if (it == classes->end()) it = classes->insert(classes->end(), x.m.classes[l]);
      map.push_back(it - classes->begin());
      identity = identity && map.back() == static_cast<int64_t>(l);
    }
    if (!identity) x.label_map = std::move(map);
  }
  return Status::OK();
}

}  // namespace

Status MergeCaches(const std::string& out, const std::vector<std::string>& from,
                   const std::function<void(const std::string&)>& info, MergeResult* result) {
  const auto t0 = std::chrono::steady_clock::now();
  std::function<void(const std::string&)> say = info ? info : [](const std::string&) {};
  if (from.size() < 2)
    return Status::InvalidArgument("kiln merge --from: give two caches or more (--from A --from B)");
  std::error_code ec;
  std::vector<Input> in;
  KILN_RETURN_IF_ERROR(ReadInputs(from, out, &in));
  for (size_t i = 1; i < in.size(); ++i) {
    const auto conflicts = Conflicts(in[0].m, in[i].m);
    if (!conflicts.empty())
      return Status::InvalidArgument(in[i].dir + " cannot join " + in[0].dir + " (" +
                                     Joined(conflicts) +
                                     "): only caches with the same fields and recipe merge; "
                                     "build or write it as the other was");
  }
  for (const Input& x : in)
    KILN_RETURN_IF_ERROR(CheckInputQuick(x.dir, "repair or rebuild it before merging"));
  std::vector<std::string> classes;
  KILN_RETURN_IF_ERROR(ReconcileClasses(&in, &classes));

  fs::create_directories(out, ec);
  if (fs::exists(fs::path(out) / kManifestName))
    return Status::InvalidArgument(out +
                                   ": already holds a finished cache; merge into a new "
                                   "directory");
  // OUT is empty, or holds what an interrupted merge left: shard links,
  // scratch directories and the duplicate report's fingerprints, all
  // replaced or checked below.
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    const bool ours = IsShardFile(n) || n.rfind(kMergeScratchPrefix, 0) == 0 ||
                      n == std::string(kLockName) || n == kDuplicatesTsvName ||
                      n == kFingerprintsDirName || n == kManifestTempName ||
                      (n.size() > 5 && n.compare(n.size() - 5, 5, "-lock") == 0);
    if (!ours)
      return Status::InvalidArgument(out + ": holds " + n +
                                     "; merge into an empty (or a new) directory");
  }

  // Indices: each cache continues where the ones before it ended. Every
  // cache's shards join as they are - no record is written again: a later
  // cache's keep their keys (ShardInfo::keyed: an LMDB key and a checksum
  // seed are the record's index in the cache it was written to) and, where
  // its classes are numbered otherwise than the merged cache's, map its
  // labels (ShardInfo::label_map, composed with one the shard had).
  uint64_t next = 0;
  MergeResult r;
  for (Input& x : in) {
    x.first = next;
    x.shards = x.m.shards;
    for (ShardInfo& sh : x.shards) {
      if (!sh.keyed) sh.key_first = sh.first;
      sh.first = sh.first - x.m.first_index + x.first;
      sh.keyed = sh.key_first != sh.first;
      if (x.label_map.empty() || sh.count == 0) continue;
      if (sh.label_map.empty()) {
        sh.label_map = x.label_map;
      } else {
        for (int64_t& to : sh.label_map) to = x.label_map[to];
      }
      bool identity = true;
      for (size_t l = 0; l < sh.label_map.size(); ++l)
        identity = identity && sh.label_map[l] == static_cast<int64_t>(l);
      if (identity) sh.label_map.clear();
    }
    if (!x.label_map.empty() && x.m.count > 0) {
      say(x.dir + ": its " + std::to_string(x.m.count) + " records become " +
          std::to_string(next) + ".." + std::to_string(next + x.m.count - 1) +
          ", their labels mapped to the merged classes");
      r.relabelled_records += x.m.count;
    }
    next += x.m.count;
  }

  Manifest merged = in[0].m;
  merged.classes = classes;
  merged.kiln_version = KilnVersion();
  merged.count = next;
  merged.shards.clear();
  for (const Input& x : in) WidenMaxDims(x.m, &merged);
  const std::string when = UtcNowIso8601();
  for (size_t i = 1; i < in.size(); ++i)
    merged.appends.push_back(
        {in[i].first, in[i].first + in[i].m.count, when, "kiln merge --from " + in[i].dir});
  KILN_RETURN_IF_ERROR(MergedRecipe(in, &merged.preprocessing));
  bool any_copied = false;
  for (const Input& x : in)
    KILN_RETURN_IF_ERROR(LinkShards(x.dir, x.shards, out, &merged, &any_copied));
  if (any_copied) say(out + ": the caches are on another file system: shards were copied");

  // No sources.tsv: the records came from several source trees (or
  // writers), which one recipe's source cannot name; each input keeps its
  // own, with its rejects.
  fs::remove(out + "/" + kDuplicatesTsvName, ec);
  KILN_RETURN_IF_ERROR(RemoveUnlistedShards(out, merged));
  KILN_RETURN_IF_ERROR(WriteManifest(out, merged));
  // Scratch directories an interrupted merge left (kiln before label maps
  // rewrote relabelled caches there).
  std::vector<fs::path> scratch;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (e.path().filename().string().rfind(kMergeScratchPrefix, 0) == 0) scratch.push_back(e.path());
  for (const fs::path& p : scratch) fs::remove_all(p, ec);

  r.caches.push_back(out);
  r.records = next;
  r.parts = static_cast<int>(in.size());
  r.shards = merged.shards.size();
  KILN_RETURN_IF_ERROR(ReportDuplicates(out, {{"", out}}, 0, &r.duplicates));
  r.duplicates_file = out + "/" + kDuplicatesTsvName;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result) *result = std::move(r);
  return Status::OK();
}

}  // namespace kiln::ingest
