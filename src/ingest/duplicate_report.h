// OUT/duplicates.tsv (internal): the records of a build that hold the same
// pixels as another, within a cache and across the train and val splits
// (docs/format.md). Written by kiln build and kiln merge.
#ifndef KILN_SRC_INGEST_DUPLICATE_REPORT_H_
#define KILN_SRC_INGEST_DUPLICATE_REPORT_H_

#include <string>
#include <vector>

#include "kiln/duplicates.h"
#include "kiln/status.h"

namespace kiln::ingest {

struct SplitCache {
  std::string split;  // "" (no split), "train" or "val"
  std::string dir;    // a finished cache
};

// Fingerprints the finished caches (in order: train before val), groups equal
// records and writes OUT/duplicates.tsv atomically, one line per member of
// every group, with the source path from each cache's sources.tsv (empty
// when it has none). counts->overlap counts the val records also in train.
Status ReportDuplicates(const std::string& out, const std::vector<SplitCache>& caches,
                        int threads, DuplicateCounts* counts);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_DUPLICATE_REPORT_H_
