#include "duplicate_report.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include <xxhash.h>

#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "core/escape.h"
#include "core/file.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace {

namespace fs = std::filesystem;

// The fingerprints of each shard's records, kept in DIR/.fingerprints/ as
// "<shard file>.<shard digest>" (24 bytes a record: the print's high and low
// halves and the label, little-endian u64/u64/i64), so that the report
// after an append reads only the new records. A file names the digest of
// the shard it was made from: a shard rewritten (--repair) has another, and
// its old file is not read (and is removed).
constexpr size_t kPrintBytes = 24;

std::string PrintsDir(const std::string& dir) { return dir + "/" + kFingerprintsDirName; }
// A shard read with a label_map (linked by kiln merge --from) gets the
// map's digest too: the labels kept are the mapped ones.
std::string PrintsFile(const ShardInfo& s) {
  std::string name = s.file + "." + s.digest;
  if (!s.label_map.empty())
    name += ".labels-" + DigestHex(XXH3_64bits(s.label_map.data(),
                                               s.label_map.size() * sizeof(int64_t)));
  return name;
}

// The prints of the shards from the first on that have a kept file, into
// *out; returns how many records that covers.
uint64_t LoadKeptPrints(const std::string& dir, const Manifest& m, std::vector<RecordPrint>* out) {
  out->clear();
  for (const ShardInfo& s : m.shards) {
    std::string bytes;
    if (!ReadWholeFile(PrintsDir(dir) + "/" + PrintsFile(s), &bytes).ok() ||
        bytes.size() != s.count * kPrintBytes)
      break;
    for (uint64_t r = 0; r < s.count; ++r) {
      RecordPrint p;
      std::memcpy(&p.print.high, bytes.data() + r * kPrintBytes, 8);
      std::memcpy(&p.print.low, bytes.data() + r * kPrintBytes + 8, 8);
      std::memcpy(&p.label, bytes.data() + r * kPrintBytes + 16, 8);
      out->push_back(p);
    }
  }
  return out->size();
}

// Writes the file of every shard that lacks one and removes the others
// (best effort: a cache whose folder cannot take them is reported all the
// same, and fingerprinted again next time).
void KeepPrints(const std::string& dir, const Manifest& m, const std::vector<RecordPrint>& prints) {
  std::error_code ec;
  fs::create_directories(PrintsDir(dir), ec);
  if (ec) return;
  std::set<std::string> current;
  for (const ShardInfo& s : m.shards) {
    current.insert(PrintsFile(s));
    if (fs::exists(PrintsDir(dir) + "/" + PrintsFile(s), ec)) continue;
    std::string bytes(s.count * kPrintBytes, '\0');
    for (uint64_t r = 0; r < s.count && s.first + r < prints.size(); ++r) {
      const RecordPrint& p = prints[s.first + r];
      std::memcpy(&bytes[r * kPrintBytes], &p.print.high, 8);
      std::memcpy(&bytes[r * kPrintBytes + 8], &p.print.low, 8);
      std::memcpy(&bytes[r * kPrintBytes + 16], &p.label, 8);
    }
    (void)WriteFileAtomic(PrintsDir(dir), PrintsFile(s), PrintsFile(s) + ".tmp", bytes);
  }
  for (const auto& e : fs::directory_iterator(PrintsDir(dir), ec))
    if (!current.count(e.path().filename().string())) fs::remove(e.path(), ec);
}

}  // namespace

Status ReportDuplicates(const std::string& out, const std::vector<SplitCache>& caches,
                        int threads, DuplicateCounts* counts) {
  std::vector<std::vector<RecordPrint>> prints(caches.size());
  std::vector<std::vector<std::string>> paths(caches.size());  // by record
  std::vector<std::vector<std::string>> classes(caches.size());
  size_t train = 0, val = 0;  // positions of the splits, for the overlap count
  for (size_t c = 0; c < caches.size(); ++c) {
    if (caches[c].split == SplitDirs()[0]) train = c;
    if (caches[c].split == SplitDirs()[1]) val = c;
    std::unique_ptr<CacheReader> reader;
    KILN_RETURN_IF_ERROR(CacheReader::Open(caches[c].dir, ReaderOptions(), &reader));
    const uint64_t kept = LoadKeptPrints(caches[c].dir, reader->manifest(), &prints[c]);
    KILN_RETURN_IF_ERROR(FingerprintCache(*reader, threads, &prints[c], kept));
    KeepPrints(caches[c].dir, reader->manifest(), prints[c]);
    classes[c] = reader->manifest().classes;
    std::vector<RecordedSource> sources;
    paths[c].resize(prints[c].size());
    if (ReadSourcesTsv(caches[c].dir + "/" + kSourcesTsvName, &sources).ok())
      for (const RecordedSource& s : sources)
        if (s.record >= 0 && static_cast<uint64_t>(s.record) < paths[c].size())
          paths[c][s.record] = EscapeName(s.item.rel_path);
  }
  const std::vector<DuplicateGroup> groups = FindDuplicates(prints);
  *counts = CountDuplicates(groups, caches.size() > 1 ? val : 0, train);
  std::string tsv = "group\tsplit\trecord\tlabel\tclass\tpath\n";
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const DuplicateMember& m : groups[g].members) {
      const std::string& split = caches[m.cache].split;
      const std::string name =
          m.label >= 0 && static_cast<size_t>(m.label) < classes[m.cache].size()
              ? classes[m.cache][m.label]
              : "";
      tsv += std::to_string(g) + "\t" + (split.empty() ? "-" : split) + "\t" +
             std::to_string(m.record) + "\t" + std::to_string(m.label) + "\t" + name + "\t" +
             paths[m.cache][m.record] + "\n";
    }
  }
  return WriteFileAtomic(out, kDuplicatesTsvName, std::string(kDuplicatesTsvName) + ".tmp", tsv);
}

}  // namespace kiln::ingest
