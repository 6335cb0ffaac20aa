// Writing shards (internal to kiln_core): the one code that puts records
// into an LMDB shard, for CacheWriter, RewriteRecords and kiln merge alike,
// so that the same records written with the same batches give the same
// file, byte for byte.
#ifndef KILN_SRC_CORE_SHARD_WRITE_H_
#define KILN_SRC_CORE_SHARD_WRITE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "core/lmdb_env.h"
#include "kiln/status.h"

namespace kiln {

// The value of record `index` for CommitBatch; must stay valid until the
// next call.
using ValueOf = std::function<Status(uint64_t index, MDB_val* value)>;

// Appends records first..first+count-1 to `env` in one write transaction
// (MDB_APPEND). On MDB_MAP_FULL the transaction is dropped, the map doubled
// and the batch redone. This is the only code that writes records, for a
// build and for a rewrite alike, so that the same records written with the
// same batches give the same file, byte for byte (see WriteShardCanonically).
// pack_bytes > 0: the batch's records go in packs (kiln/record.h), each
// closed after the record that takes it to pack_bytes, or at the batch's
// end; a pack of one record is stored as its value. *values, when given,
// gets the LMDB entries put.
Status CommitBatch(LmdbEnv* env, uint64_t first, uint64_t count, const ValueOf& value_of,
                   uint64_t pack_bytes = 0, uint64_t* values = nullptr);

// Syncs the shard held in `env`, closes it and removes its lock file.
Status SyncAndClose(LmdbEnv* env);

// The canonical form of a shard: its records written into a fresh file with
// a map of `map_size` bytes and a commit after every `per_commit` records
// (and after the last), exactly as an uninterrupted CacheWriter writes them.
// LMDB's file is a function of that sequence of operations, so a build that
// was resumed from one of those commits, a repaired shard and a fresh build
// all end with the same bytes. Writes `path`.tmp, then renames it over path.
// per_commit 0 (version 2 records, of any size): a commit after the record
// that takes the batch's value bytes to `commit_bytes` instead - for
// records of one size the same batches as per_commit = ceil(commit_bytes /
// value size).
// pack_bytes as CommitBatch's; *values gets the LMDB entries written.
Status WriteShardCanonically(const std::string& path, uint64_t map_size, uint64_t per_commit,
                             uint64_t first, uint64_t count, const ValueOf& value_of,
                             uint64_t commit_bytes = 0, uint64_t pack_bytes = 0,
                             uint64_t* values = nullptr);

// The digest of an existing shard.
Status DigestOfShard(const LmdbEnv& env, std::string* digest);

}  // namespace kiln

#endif  // KILN_SRC_CORE_SHARD_WRITE_H_
