// kiln build --append (internal): what a build adds to the finished cache
// it made before, from a source tree to which files were added.
#ifndef KILN_SRC_INGEST_APPEND_PLAN_H_
#define KILN_SRC_INGEST_APPEND_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cache_layout.h"
#include "kiln/ingest/build.h"
#include "kiln/manifest.h"
#include "kiln/status.h"
#include "sources_tsv.h"

namespace kiln::ingest {

struct AppendPlan {
  Manifest base;                          // the finished cache's manifest
  std::vector<RecordedSource> recorded;   // its sources.tsv
  std::vector<size_t> added;              // positions in the listing of the new sources, in order
};

// An append writes the grown cache's sources.tsv and rejects.tsv under
// these names first and renames them into place once its manifest is
// published, so that until then DIR's lists describe the records its
// manifest has (an interrupted append is planned again from them).
inline const std::string kPendingSources = std::string(kSourcesTsvName) + ".append";
inline const std::string kPendingRejects = std::string(kRejectsName) + ".append";

// Puts the lists an earlier append left pending into place when its manifest
// was published (its append.json marker is gone or names another count than
// the manifest's), or discards them when it was not. REQUIRES: DIR holds a
// readable manifest.
Status SettlePendingLists(const std::string& dir, const Manifest& m);

// Reads the finished cache in DIR (its manifest and sources.tsv) and finds
// the sources of `src` it does not record. InvalidArgument, naming the file
// and saying to rebuild, when a source it records is gone or changed (size
// or mtime), or when DIR holds no finished cache of kiln build.
Status PlanAppend(const std::string& dir, const SourceList& src, AppendPlan* out);

// The classes after the append: the cache's (`base`, escaped as manifests
// hold them) in their order, then the names only the new sources have, in
// the listing's order. Relabels the `added` items of *src by class name
// and sets src->classes to that list (raw names).
void AppendClasses(const std::vector<std::string>& base, const std::vector<size_t>& added,
                   SourceList* src);

// sources.tsv after the append: every source of the listing with the record
// the cache recorded for it, and for the added ones in `order` (positions in
// the listing), records from `first` on, except those `rejected` (by their
// position in `order`).
std::vector<RecordedSource> AppendedSources(const AppendPlan& plan, const SourceList& src,
                                            const std::vector<size_t>& order, uint64_t first,
                                            const std::vector<bool>& rejected);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_APPEND_PLAN_H_
