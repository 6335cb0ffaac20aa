#include "duplicate_report.h"

#include <memory>

#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "core/escape.h"
#include "core/file.h"
#include "sources_tsv.h"

namespace kiln::ingest {

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
    KILN_RETURN_IF_ERROR(FingerprintCache(*reader, threads, &prints[c]));
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
