// What both kinds of kiln merge do with records (internal): link a shard
// file into the merged cache, or write a cache's records again under other
// indices and labels.
#ifndef KILN_SRC_INGEST_MERGE_RECORDS_H_
#define KILN_SRC_INGEST_MERGE_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/manifest.h"
#include "kiln/status.h"

namespace kiln::ingest {

// Hard-links `from` to `to` (a link left by an interrupted run counts);
// copies it where the file systems differ or forbid links (*copied set).
Status LinkOrCopy(const std::string& from, const std::string& to, bool* copied);

// Links (LinkOrCopy) the `shards` of the directory `dir` into `out` as the
// next shards of `merged` (shard-K.mdb from K = merged's shard count on),
// appending their entries; sets *copied when one was copied.
Status LinkShards(const std::string& dir, const std::vector<ShardInfo>& shards,
                  const std::string& out, Manifest* merged, bool* copied);

// Removes the shard files in `out` (and their LMDB lock files) that
// `merged` does not list: what an interrupted merge of other, larger
// inputs left past the new shards. Called before the manifest is written.
Status RemoveUnlistedShards(const std::string& out, const Manifest& merged);

// kiln verify --level quick of an input of a merge: Corruption naming DIR,
// the count and the first problem, then `todo` ("rebuild this part"),
// when it is not clean.
Status CheckInputQuick(const std::string& dir, const std::string& todo);

// Widens each field's largest sizes in *merged to take `m`'s (the fields
// of both in the same order).
void WidenMaxDims(const Manifest& m, Manifest* merged);

// Writes the records of the cache (or part) in `dir`, whose manifest is
// `m`, again into the empty directory `tmp` (removed first) under the
// indices `first`.. , each checked against its checksum on the way (as
// the reader reads it: a linked shard's labels mapped). Shards are cut as
// m's largest shard, batched as m's commits. *shards gets the new
// shards (file names inside `tmp`, global firsts).
Status RewriteRecords(const std::string& dir, const Manifest& m, uint64_t first,
                      const std::string& tmp, std::vector<ShardInfo>* shards);

}  // namespace kiln::ingest

#endif  // KILN_SRC_INGEST_MERGE_RECORDS_H_
