// The one wrapper around LMDB (internal header): RAII owners for an
// environment and a transaction, and the single translator of LMDB error
// codes into Status values.
#ifndef KILN_SRC_CORE_LMDB_ENV_H_
#define KILN_SRC_CORE_LMDB_ENV_H_

#include <lmdb.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kiln/status.h"

namespace kiln {

// Maps an LMDB return code to a Status whose message starts with `context`
// (normally the shard path). MDB_SUCCESS gives OK.
Status LmdbStatus(int rc, const std::string& context);

class LmdbTxn;

// Owns an MDB_env opened on one shard file (MDB_NOSUBDIR).
class LmdbEnv {
 public:
  LmdbEnv() = default;
  ~LmdbEnv() { Close(); }
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;

  // Opens `path` for bulk writing (created if absent) with a map of
  // `map_size` bytes (0: the size recorded in an existing file).
  Status OpenForWrite(const std::string& path, uint64_t map_size);
  // Opens `path` read-only: MDB_RDONLY|MDB_NOTLS|MDB_NORDAHEAD, retried with
  // MDB_NOLOCK when the lock file cannot be created (read-only filesystem).
  Status OpenForRead(const std::string& path, unsigned max_readers);
  void Close();

  MDB_env* env() const { return env_; }
  MDB_dbi dbi() const { return dbi_; }
  const std::string& path() const { return path_; }
  uint64_t map_size() const { return map_size_; }
  // The start of a read-only environment's memory map: a value returned by
  // mdb_get lies at map() + its offset in the file. Null for writers, for
  // an empty database and for pages of another size than the OS's.
  const uint8_t* map() const { return map_; }
  // LMDB's descriptor of the data file (-1 when closed); LMDB owns it.
  int fd() const;
  // REQUIRES: no transaction active in this process on this env.
  Status SetMapSize(uint64_t bytes);

 private:
  Status OpenDbi(bool write);
  void FindMap(const LmdbTxn& txn);  // sets map_
  MDB_env* env_ = nullptr;
  MDB_dbi dbi_ = 0;
  uint64_t map_size_ = 0;
  const uint8_t* map_ = nullptr;
  std::string path_;
};

// Opens `path` read-only (as LmdbEnv::OpenForRead) once per process: while
// an environment on the same file (device and inode) is open in this
// process, it is shared. LMDB forbids two environments on one file in one
// process: closing either clears every reader slot of this process in the
// lock file, so the other's next read fails with MDB_BAD_RSLOT (seen with
// two kiln.Cache objects of one cache in Python). A forked child gets its
// own (an environment must not cross fork). The first opener's
// `max_readers` holds while the environment is shared.
Status OpenSharedForRead(const std::string& path, unsigned max_readers,
                         std::shared_ptr<const LmdbEnv>* out);

class LmdbTxn;

// Calls fn(key, value) for each record of `env`'s database in key order,
// inside `txn`, until fn returns false: each record of a pack (kiln/record.h)
// on its own, under its key (the pack's key + its place in the pack); a
// pack whose table is damaged as its stored value, under the pack's key
// (DecodeRecordHeader names it). *values, when given, gets the number of
// LMDB entries walked. Returns the LMDB error of a failed cursor or read
// (MDB_NOTFOUND at the end is success).
Status ForEachRecord(const LmdbEnv& env, const LmdbTxn& txn,
                     const std::function<bool(const MDB_val& key, const MDB_val& value)>& fn,
                     uint64_t* values = nullptr);
// As ForEachRecord, and fn also gets the LMDB entry the record lies in
// (`stored`: the value itself, or its pack) and whether it is the first
// record given from that entry.
Status ForEachRecordIn(
    const LmdbEnv& env, const LmdbTxn& txn,
    const std::function<bool(const MDB_val& key, const MDB_val& value, const MDB_val& stored,
                             bool first_of_stored)>& fn,
    uint64_t* values = nullptr);

// The cursor FindRecord finds a pack with: opened on first use, renewed
// onto the transaction after MarkStale (its read transaction was reset
// and renewed), closed with this object.
class PackCursor {
 public:
  PackCursor() = default;
  ~PackCursor();
  PackCursor(const PackCursor&) = delete;
  PackCursor& operator=(const PackCursor&) = delete;
  void MarkStale() { stale_ = cursor_ != nullptr; }

 private:
  friend Status FindRecord(const LmdbEnv&, MDB_txn*, uint64_t, bool, PackCursor*, MDB_val*);
  MDB_cursor* cursor_ = nullptr;
  bool stale_ = false;
};

// The stored value of the record under `key` in `txn` (read-only or not):
// a value of its own or a record of a pack. `packed`: the shard may hold
// packs (its ShardInfo::values), so a value is a pack or a record, and a
// key that is not an LMDB key is looked for in the pack before it, with
// `cursor`; without `packed` the value is given as stored, not read.
// NotFound when no record has the key, Corruption for a damaged pack,
// LMDB's error otherwise.
Status FindRecord(const LmdbEnv& env, MDB_txn* txn, uint64_t key, bool packed,
                  PackCursor* cursor, MDB_val* value);

// Owns an MDB_txn; aborts it on destruction unless committed.
class LmdbTxn {
 public:
  LmdbTxn() = default;
  ~LmdbTxn() { Abort(); }
  LmdbTxn(const LmdbTxn&) = delete;
  LmdbTxn& operator=(const LmdbTxn&) = delete;
  LmdbTxn(LmdbTxn&& o) noexcept : txn_(o.txn_), ctx_(o.ctx_) { o.txn_ = nullptr; }

  Status Begin(const LmdbEnv& env, bool read_only);
  Status Commit();
  // Commits and returns LMDB's code (MDB_MAP_FULL means: grow and redo).
  int CommitRc();
  void Abort();
  // Read transactions: release the snapshot but keep the handle for Renew.
  void Reset();
  Status Renew();
  MDB_txn* get() const { return txn_; }

 private:
  MDB_txn* txn_ = nullptr;
  // The env's path, for messages; a pointer so that Begin allocates nothing.
  // REQUIRES: the env outlives the transaction.
  const std::string* ctx_ = nullptr;
};

}  // namespace kiln

#endif  // KILN_SRC_CORE_LMDB_ENV_H_
