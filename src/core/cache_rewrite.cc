// RewriteRecords (kiln/cache_writer.h): a finished cache's records
// replaced in place, each affected shard written again canonically.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/file.h"
#include "core/lmdb_env.h"
#include "core/shard_write.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "kiln/dir_lock.h"

namespace kiln {

Status RewriteRecords(const std::string& dir, const std::vector<RecordFix>& fixes) {
  std::unique_ptr<DirLock> lock;
  KILN_RETURN_IF_ERROR(DirLock::Acquire(dir, &lock));
  Manifest m;
  KILN_RETURN_IF_ERROR(ReadManifest(dir, &m));
  const bool v2 = m.format_version == kFormatVersion2;
  const uint64_t bytes = v2 ? 0 : m.shape.NumElements() * DTypeSize(m.dtype);
  if ((v2 ? m.commit_bytes : m.commit_records) == 0 || m.initial_map_size == 0)
    return Status::NotSupported(dir + ": the manifest does not record the writer's layout (a cache "
                                "from an older kiln); rebuild it instead of repairing");
  std::vector<std::vector<const RecordFix*>> by_shard(m.shards.size());
  for (const RecordFix& f : fixes) {
    const int s = m.ShardFor(f.index);
    if (s < 0) return Status::InvalidArgument("record " + std::to_string(f.index) + " is outside " + dir);
    if (v2)
      KILN_RETURN_IF_ERROR(CheckFieldsFit(m.fields, f.index, f.fields.data(),
                                          static_cast<int>(f.fields.size()), /*within_max=*/true)
                               .WithContext(dir));
    by_shard[s].push_back(&f);
  }
  std::vector<uint8_t> value(kRecordHeaderSize + bytes);
  for (size_t s = 0; s < m.shards.size(); ++s) {
    if (by_shard[s].empty()) continue;
    ShardInfo& info = m.shards[s];
    if (info.linked())
      return Status::NotSupported(
          dir + ": record " + std::to_string(by_shard[s].front()->index) + " lies in " +
          info.file + ", linked unchanged from another cache by kiln merge --from: repair "
          "that cache, then merge again");
    const std::string path = dir + "/" + info.file;
    const std::string fresh_path = path + ".repair";
    std::map<uint64_t, const RecordFix*> fix;
    for (const RecordFix* f : by_shard[s]) fix[f->index] = f;
    // The shard is written anew in its canonical form (the batches of a
    // fresh build) from its good records and the fixes, so that it comes
    // out byte for byte as a fresh build's.
    Status st;
    uint64_t values = 0;
    {  // the old shard's snapshot, cursor and map end before it is replaced
      LmdbEnv old_env;
      KILN_RETURN_IF_ERROR(old_env.OpenForRead(path, 4));
      LmdbTxn rd;
      KILN_RETURN_IF_ERROR(rd.Begin(old_env, true));
      PackCursor cursor;
      st = WriteShardCanonically(
          fresh_path, m.initial_map_size, v2 ? 0 : m.commit_records, info.first, info.count,
          [&](uint64_t i, MDB_val* v) -> Status {
            auto f = fix.find(i);
            if (f != fix.end() && v2) {
              const RecordFix& r = *f->second;
              const int n = static_cast<int>(r.fields.size());
              value.resize(RecordV2Size(r.fields.data(), n));
              EncodeRecordV2(i, r.fields.data(), n, value.data());
              *v = MDB_val{value.size(), value.data()};
              return Status::OK();
            }
            if (f != fix.end()) {
              std::memcpy(value.data() + kRecordHeaderSize, f->second->payload, bytes);
              EncodeRecordHeader(i, m.dtype, m.shape, f->second->label,
                                 value.data() + kRecordHeaderSize, value.data());
              *v = MDB_val{value.size(), value.data()};
              return Status::OK();
            }
            const Status found = FindRecord(old_env, rd.get(), i, info.packed(), &cursor, v);
            if (found.IsNotFound())
              return Status::Corruption(path + ": record " + std::to_string(i) +
                                        " is missing and no fix was given for it");
            return found.WithContext(path + ": record " + std::to_string(i));
          },
          m.commit_bytes, m.pack_bytes, &values);
    }
    if (m.pack_bytes > 0) info.values = values;
    KILN_RETURN_IF_ERROR(st);
    {
      LmdbEnv fresh;
      KILN_RETURN_IF_ERROR(fresh.OpenForRead(fresh_path, 4));
      KILN_RETURN_IF_ERROR(DigestOfShard(fresh, &info.digest));
    }
    ::unlink((fresh_path + kLmdbLockSuffix).c_str());
    KILN_RETURN_IF_ERROR(FileSize(fresh_path, &info.bytes));
    if (::rename(fresh_path.c_str(), path.c_str()) != 0) return PosixError(path, errno);
  }
  return WriteManifest(dir, m);
}

}  // namespace kiln
