#include "core/shard_write.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "core/file.h"
#include "core/shard_digest.h"
#include "kiln/cache_layout.h"
#include "kiln/record.h"

namespace kiln {

namespace {

// What a short write of `bytes` more to the file `path` ran into: EFBIG when
// it would pass this process's file size limit, ENOSPC when the filesystem
// has no room for it (and 1 MiB more), EIO otherwise.
int ShortWriteCause(const std::string& path, uint64_t bytes) {
  struct stat file;
  struct rlimit limit;
  if (::stat(path.c_str(), &file) == 0 && ::getrlimit(RLIMIT_FSIZE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(file.st_size) + bytes > static_cast<uint64_t>(limit.rlim_cur))
    return EFBIG;
  struct statvfs fs;
  if (::statvfs(path.c_str(), &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < bytes + (1u << 20))
    return ENOSPC;
  return EIO;
}

}  // namespace

Status CommitBatch(LmdbEnv* env, uint64_t first, uint64_t count, const ValueOf& value_of,
                   uint64_t pack_bytes, uint64_t* values) {
  std::vector<uint8_t> pack, staging;
  std::vector<const uint8_t*> parts;
  std::vector<size_t> sizes, offsets;
  for (;;) {
    LmdbTxn txn;
    KILN_RETURN_IF_ERROR(txn.Begin(*env, false));
    int rc = MDB_SUCCESS;
    uint64_t batch_bytes = 0, put = 0;
    for (uint64_t r = 0; r < count && rc == MDB_SUCCESS;) {
      uint8_t key[kKeySize];
      EncodeKey(first + r, key);
      MDB_val k{kKeySize, key}, v;
      KILN_RETURN_IF_ERROR(value_of(first + r, &v));
      uint64_t n = 1;
      if (pack_bytes > 0) {
        // The records of this pack: value_of's values stay valid only until
        // its next call, so each is copied as it comes.
        staging.clear();
        offsets.clear();
        auto take = [&](const MDB_val& x) {
          offsets.push_back(staging.size());
          sizes.push_back(x.mv_size);
          const uint8_t* p = static_cast<const uint8_t*>(x.mv_data);
          staging.insert(staging.end(), p, p + x.mv_size);
        };
        sizes.clear();
        take(v);
        while (staging.size() < pack_bytes && r + n < count) {
          MDB_val next;
          KILN_RETURN_IF_ERROR(value_of(first + r + n, &next));
          take(next);
          ++n;
        }
        if (n > 1) {
          parts.clear();
          for (size_t o : offsets) parts.push_back(staging.data() + o);
          EncodePack(parts.data(), sizes.data(), n, &pack);
          v = MDB_val{pack.size(), pack.data()};
        } else {
          v = MDB_val{staging.size(), staging.data()};
        }
      }
      batch_bytes += v.mv_size;
      rc = mdb_put(txn.get(), env->dbi(), &k, &v, MDB_APPEND);
      ++put;
      r += n;
    }
    if (rc == MDB_SUCCESS) rc = txn.CommitRc();
    // LMDB reports a short write - the disk filling up in the middle of its
    // writev - as EIO: say what it ran into.
    if (rc == EIO) rc = ShortWriteCause(env->path(), batch_bytes);
    if (rc == MDB_MAP_FULL) {
      txn.Abort();
      KILN_RETURN_IF_ERROR(env->SetMapSize(env->map_size() * 2));
      continue;
    }
    if (rc == MDB_KEYEXIST)
      return Status::InvalidArgument(env->path() + ": record " + std::to_string(first) +
                                     " or later already present (keys must increase)");
    if (rc == MDB_SUCCESS && values) *values = put;
    return LmdbStatus(rc, env->path() + ": commit");
  }
}

Status SyncAndClose(LmdbEnv* env) {
  const std::string path = env->path();
  KILN_RETURN_IF_ERROR(LmdbStatus(mdb_env_sync(env->env(), 1), path + ": sync"));
  env->Close();
  ::unlink((path + kLmdbLockSuffix).c_str());
  return Status::OK();
}

Status WriteShardCanonically(const std::string& path, uint64_t map_size, uint64_t per_commit,
                             uint64_t first, uint64_t count, const ValueOf& value_of,
                             uint64_t commit_bytes, uint64_t pack_bytes, uint64_t* values) {
  const std::string tmp = path + ".tmp";
  uint64_t total = 0;
  ::unlink(tmp.c_str());
  ::unlink((tmp + kLmdbLockSuffix).c_str());
  LmdbEnv out;
  KILN_RETURN_IF_ERROR(out.OpenForWrite(tmp, map_size));
  for (uint64_t done = 0; done < count;) {
    uint64_t n = std::min(per_commit, count - done);
    if (per_commit == 0) {
      uint64_t bytes = 0;
      for (n = 0; done + n < count && bytes < commit_bytes; ++n) {
        MDB_val v;
        KILN_RETURN_IF_ERROR(value_of(first + done + n, &v));
        bytes += v.mv_size;
      }
    }
    uint64_t put = 0;
    KILN_RETURN_IF_ERROR(CommitBatch(&out, first + done, n, value_of, pack_bytes, &put));
    total += put;
    done += n;
  }
  if (values) *values = total;
  KILN_RETURN_IF_ERROR(SyncAndClose(&out));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError(path, errno);
  return Status::OK();
}

Status DigestOfShard(const LmdbEnv& env, std::string* digest) {
  LmdbTxn txn;
  KILN_RETURN_IF_ERROR(txn.Begin(env, true));
  ShardDigest d;
  KILN_RETURN_IF_ERROR(ForEachRecord(env, txn, [&](const MDB_val&, const MDB_val& v) {
    const uint8_t* value = static_cast<const uint8_t*>(v.mv_data);
    const size_t at = StoredChecksumOffset(value, v.mv_size);
    if (v.mv_size >= (at == kChecksumOffsetV2 ? kRecordV2HeaderSize : kRecordHeaderSize))
      d.Add(value + at);
    return true;
  }));
  *digest = d.Hex();
  return Status::OK();
}

}  // namespace kiln
