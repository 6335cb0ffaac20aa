// kiln build --repair (internal): rewrites only the records of a finished
// cache that verify finds bad, from their sources; everything else stays as
// it is, and the repaired cache has the bytes of a fresh build.
#ifndef KILN_SRC_INGEST_REPAIR_H_
#define KILN_SRC_INGEST_REPAIR_H_

#include <string>

#include "kiln/ingest/build.h"
#include "kiln/preprocessing.h"
#include "preprocessor.h"

namespace kiln::ingest {

// Repairs the cache in DIR, which `recipe` must have made from `src` (the
// recipe of this build's arguments and listing: InvalidArgument saying
// what differs otherwise). A format 2 record is made again with every
// field, its labels and targets taken from `src`.
// Corruption when the damage is not record by record (a shard missing,
// a record outside its shard, no source recorded): rebuild with --force.
Status RepairCache(const std::string& dir, const SourceList& src, const Preprocessing& recipe,
                   const Preprocessor& pre, int threads, const InfoFn& info, BuildResult* result);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_REPAIR_H_
