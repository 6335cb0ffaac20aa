// kiln inspect CACHE: what a cache holds and how it was made.
#include <sys/stat.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "core/page_cache.h"
#include "doctor.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "core/file.h"

namespace kiln::tools {
namespace {

// Records per class, read from every record's header (one page of each
// record: quick once the cache is in the page cache). Records that cannot
// be read, or have no label in the classes, count in *unlabeled: inspect
// describes a damaged cache too, kiln verify says what is wrong.
void CountClasses(const CacheReader& reader, std::vector<uint64_t>* counts, uint64_t* unlabeled) {
  const Manifest& m = reader.manifest();
  counts->assign(m.classes.size(), 0);
  *unlabeled = 0;
  std::unique_ptr<ReadTxn> txn = reader.BeginRead();
  for (uint64_t i = 0; i < m.count; ++i) {
    RecordView v;
    if (txn->Get(m.first_index + i, &v).ok() && v.label >= 0 &&
        static_cast<uint64_t>(v.label) < counts->size())
      ++(*counts)[v.label];
    else
      ++*unlabeled;
    if (i % 4096 == 4095) txn->Reset();  // keep the snapshot short
  }
}

// The histogram: every class up to 40 of them, otherwise the smallest and
// largest and the flagged ones. A class under 1% of the mean count is flagged.
void PrintClassCounts(const Manifest& m, const std::vector<uint64_t>& counts, uint64_t unlabeled) {
  if (counts.empty()) return;
  uint64_t total = 0;
  size_t lo = 0, hi = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    total += counts[c];
    if (counts[c] < counts[lo]) lo = c;
    if (counts[c] > counts[hi]) hi = c;
  }
  const double mean = static_cast<double>(total) / counts.size();
  auto rare = [&](size_t c) { return counts[c] < 0.01 * mean; };
  size_t flagged = 0;
  for (size_t c = 0; c < counts.size(); ++c) flagged += rare(c);
  char head[160];
  std::snprintf(head, sizeof(head),
                "class counts:  mean %.1f, smallest %llu (%zu), largest %llu (%zu)", mean,
                static_cast<unsigned long long>(counts[lo]), lo,
                static_cast<unsigned long long>(counts[hi]), hi);
  std::cout << head;
  if (unlabeled) std::cout << "; " << unlabeled << " unreadable or without a class (kiln verify)";
  std::cout << "\n";
  const bool all = counts.size() <= 40;
  for (size_t c = 0; c < counts.size(); ++c) {
    if (!all && !rare(c) && c != lo && c != hi) continue;
    std::cout << "  " << c << "=" << m.classes[c] << "  " << counts[c]
              << (rare(c) ? "  * under 1% of the mean" : "") << "\n";
  }
  if (flagged)
    std::cout << "  " << flagged << " class" << (flagged == 1 ? "" : "es")
              << " under 1% of the mean count (*): too few samples to learn from; add samples, "
                 "or merge or drop the class\n";
}

// The bytes and count of the source files that became records, from the
// cache's sources.tsv (docs/format.md: record path label size mtime_ns).
// False when the cache has none (it was not made by kiln build).
bool SourceBytes(const std::string& dir, uint64_t* bytes, uint64_t* files) {
  std::ifstream in(dir + "/" + kSourcesTsvName);
  if (!in) return false;
  std::string line;
  std::getline(in, line);  // header
  *bytes = *files = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
    if (f.size() != 5 || f[0].empty() || f[0][0] == '-') continue;
    *bytes += std::strtoull(f[3].c_str(), nullptr, 10);
    ++*files;
  }
  return *files > 0;
}

// How the build went and where the cache lives: source size against the
// cache's, when it was finished, duplicates, and whether it fits in RAM.
void PrintProvenance(const std::string& dir, uint64_t disk) {
  uint64_t src_bytes = 0, files = 0;
  if (SourceBytes(dir, &src_bytes, &files)) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%.2f", static_cast<double>(disk) / src_bytes);
    std::cout << "sources:       " << files << " files, " << HumanBytes(static_cast<double>(src_bytes))
              << " (the cache is " << ratio << "x their size)\n";
  }
  struct stat st;
  if (::stat((dir + "/" + kManifestName).c_str(), &st) == 0) {
    char when[64];
    std::tm tm;
    gmtime_r(&st.st_mtime, &tm);
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
    std::cout << "finished:      " << when << " (manifest.json written)\n";
  }
  // OUT/duplicates.tsv lies in the cache, or beside train/ and val/.
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::vector<std::string> reports = {trimmed + "/" + kDuplicatesTsvName};
  const std::string base = trimmed.substr(trimmed.find_last_of('/') + 1);
  for (const std::string& split : SplitDirs())
    if (base == split) reports.push_back(trimmed + "/../" + kDuplicatesTsvName);
  for (const std::string& report : reports) {
    std::ifstream in(report);
    if (!in) continue;
    uint64_t lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    std::cout << "duplicates:    "
              << (lines <= 1 ? std::string("none")
                             : std::to_string(lines - 1) + " records in groups of equal pixels")
              << " (" << report << ")\n";
    break;
  }
  std::string text;
  MemInfo mem;
  if (ReadWholeFile("/proc/meminfo", &text).ok() && ParseMemInfo(text, &mem).ok()) {
    mem.cgroup_limit = CgroupMemoryLimit();
    const bool fits = disk <= mem.usable();
    const std::string usable = HumanBytes(static_cast<double>(mem.usable()));
    std::cout << "memory:        " << (fits ? "fits" : "does not fit")
              << (mem.usable() < mem.available
                      ? " in the " + usable + " this memory cgroup allows"
                      : " in this machine's " + usable + " of available RAM")
              << (fits ? ": after the first epoch, epochs read from the page cache\n"
                       : ": every epoch reads all of it from the disk, at the disk's speed (kiln "
                         "bench CACHE --cold measures it); use a smaller --size or --dtype uint8, "
                         "or a machine with more RAM\n");
  }
}

int RunInspect(const std::string& dir, bool as_json) {
  std::unique_ptr<CacheReader> reader;
  ReaderOptions ro;
  ro.allow_part = true;  // a part of a cache built in parts can be looked at
  Status s = CacheReader::Open(dir, ro, &reader);
  if (!s.ok()) return ReportError("inspect", s);
  const Manifest& m = reader->manifest();
  if (as_json) {
    std::cout << ManifestToJson(m);
    return kExitOk;
  }
  uint64_t disk = 0;
  for (const ShardInfo& sh : m.shards) disk += sh.bytes;
  std::cout << "cache:         " << dir << "\n"
            << "format:        kiln-cache v" << m.format_version << " (written by kiln "
            << m.kiln_version << ")\n"
            << "records:       " << m.count;
  if (m.is_part())
    std::cout << " (part " << m.part_index << " of " << m.part_count << ", from 0: records "
              << m.first_index << ".." << m.first_index + m.count - 1
              << " of the whole cache; join the parts with kiln merge)";
  std::cout << "\n";
  if (m.format_version == kFormatVersion2) {
    // Each field with its declared shape (? where it varies) and, where it
    // varies, the largest it took.
    std::cout << "fields:        " << m.fields.size() << "\n";
    for (size_t f = 0; f < m.fields.size(); ++f) {
      const FieldSpec& fs = m.fields[f];
      std::cout << "  " << fs.name << "  " << DTypeName(fs.dtype) << " " << fs.ShapeText();
      if (!fs.fixed()) {
        std::cout << " (largest";
        for (int i = 0; i < fs.ndim; ++i) std::cout << (i ? "x" : " ") << fs.max_dims[i];
        std::cout << ")";
      }
      if (fs.codec != Codec::kRaw)
        std::cout << "  stored as " << CodecName(fs.codec) << " (decoded at load time)";
      if (static_cast<int>(f) == m.image_field) std::cout << "  [image: what loaders batch]";
      if (static_cast<int>(f) == m.label_field) std::cout << "  [label]";
      std::cout << "\n";
    }
  } else {
    std::cout << "sample:        " << DTypeName(m.dtype) << " " << m.shape.ToString() << " ("
              << HumanBytes(static_cast<double>(reader->record_bytes())) << " each)\n";
  }
  std::cout << "classes:       " << m.classes.size();
  for (size_t i = 0; i < m.classes.size() && i < 20; ++i)
    std::cout << (i ? ", " : " (") << i << "=" << m.classes[i];
  if (!m.classes.empty()) std::cout << (m.classes.size() > 20 ? ", ...)" : ")");
  std::cout << "\nsize on disk:  " << HumanBytes(static_cast<double>(disk)) << " in "
            << m.shards.size() << " shard" << (m.shards.size() == 1 ? "" : "s") << "\n";
  for (const ShardInfo& sh : m.shards) {
    std::cout << "  " << sh.file << "  records " << sh.first << ".."
              << (sh.count ? sh.first + sh.count - 1 : sh.first) << " (" << sh.count << ")  "
              << HumanBytes(static_cast<double>(sh.bytes)) << "  digest " << sh.digest;
    // A shard kiln merge --from linked from another cache: its keys there,
    // and how its stored labels map to these classes.
    if (sh.keyed) std::cout << "  linked, keys " << sh.key_first << "..";
    if (!sh.label_map.empty()) {
      std::cout << "  labels";
      for (size_t l = 0; l < sh.label_map.size() && l < 10; ++l)
        std::cout << (l ? ", " : " ") << l << "->" << sh.label_map[l];
      if (sh.label_map.size() > 10) std::cout << ", ...";
    }
    std::cout << "\n";
  }
  PrintProvenance(dir, disk);
  std::vector<uint64_t> counts;
  uint64_t unlabeled = 0;
  CountClasses(*reader, &counts, &unlabeled);
  PrintClassCounts(m, counts, unlabeled);
  const auto pre = nlohmann::json::parse(m.preprocessing.ToJson());
  std::cout << "preprocessing:";
  if (pre.is_object() && !pre.empty()) {
    std::cout << "\n";
    for (auto it = pre.begin(); it != pre.end(); ++it)
      std::cout << "  " << it.key() << ": " << it.value().dump() << "\n";
  } else {
    std::cout << " (none recorded)\n";
  }
  return kExitOk;
}

KILN_COMMAND(Command{"inspect", "Summarize a cache: records, shape, classes, shards, sources, RAM fit, preprocessing", 30,
                     [](CLI::App* sub) -> std::function<int()> {
                       auto dir = std::make_shared<std::string>();
                       auto as_json = std::make_shared<bool>(false);
                       sub->add_option("CACHE", *dir, "cache directory")->required();
                       sub->add_flag("--json", *as_json, "print the manifest as JSON");
                       AddExamples(sub, {"kiln inspect OUT/train", "kiln inspect OUT --json"});
                       return [dir, as_json] { return RunInspect(*dir, *as_json); };
                     }});

}  // namespace
}  // namespace kiln::tools
