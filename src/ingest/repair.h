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

// Repairs the cache in DIR, which `recipe` must have made (the recipe of
// this build's arguments: InvalidArgument saying what differs otherwise).
// Corruption when the damage is not record by record (a shard missing,
// a record outside its shard, no source recorded): rebuild with --force.
Status RepairCache(const std::string& dir, const Preprocessing& recipe, const Preprocessor& pre,
                   int threads, const InfoFn& info, BuildResult* result);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_REPAIR_H_
