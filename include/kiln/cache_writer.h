// CacheWriter: appends records to a cache directory, shard by shard.
//
// Records are appended in index order, committed in large transactions, and
// the map grows on MDB_MAP_FULL instead of failing. When a shard's record
// bytes reach `shard_size` the next record starts a new shard. Finish()
// syncs every shard once and then writes manifest.json (temp + rename): until
// then the directory is an incomplete cache.
//
// Layout: every shard is written as a fresh LMDB file with commits every
// `commit_records` records of the shard (docs/format.md, "Shard layout"),
// so resumed and uninterrupted writers produce the same bytes; a shard that
// saw an explicit Commit() is rewritten that way when it is finished.
//
// Crash safety: everything committed survives a crash (the shards are synced
// at each commit only when `sync_commits` is set; otherwise at Finish). Open
// with `resume` continues after the last committed record.
//
// Thread-safety: a CacheWriter is used from one thread at a time. Two
// writers on one directory are refused: the writer holds DIR's DirLock
// (kiln/dir_lock.h) for its lifetime.
#ifndef KILN_CACHE_WRITER_H_
#define KILN_CACHE_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cache_layout.h"
#include "kiln/dir_lock.h"
#include "kiln/manifest.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln {

struct WriterOptions {
  DType dtype = DType::kFloat16;    // of every record
  Shape shape;                      // of every record; REQUIRED (ndim >= 1)
  uint64_t shard_size = 4ull << 30; // record bytes per shard before rollover; default 4 GiB
  uint64_t initial_map_size = 0;    // LMDB map of a new shard; 0 = shard_size + 25% + 64 MiB
  // Commit a transaction after this many record bytes. Small enough that
  // LMDB's dirty pages stay in the CPU caches between commits, so that the
  // commit's writev copies from cache, not from memory: 4 MiB instead of
  // 64 MiB halved the build's sys time (0.5-1.4 s vs 1.7-2.5 s for the
  // 4000-image bench corpus, interleaved runs).
  uint64_t commit_bytes = 4ull << 20;
  bool resume = false;              // continue after the committed records already in DIR
  bool sync_commits = false;        // fsync every commit (slower; survives power loss)
  // The global index of the first record (a part of a cache built in parts;
  // Finish's `meta` must then carry the part's index and count).
  uint64_t first_index = 0;
  // DIR's lock, when the caller took it first (kiln build discards an old
  // cache under it before the writer opens); it must outlive the writer.
  // nullptr: Open takes the lock itself.
  const DirLock* lock = nullptr;
  // Format 2: the records' fields, in stored order (kiln/manifest.h's
  // FieldSpec; max_dims are ignored). Non-empty: the writer writes version
  // 2 records through AppendFields, `dtype` and `shape` are unused, and
  // commits come after the record that takes a batch to commit_bytes of
  // values (the cadence the manifest's layout.commit_bytes records).
  std::vector<FieldSpec> fields;
  // The field of class indices ("" for none): an int64/int32 scalar field.
  std::string label_field;
  // Append to the finished cache in DIR instead of writing a new one. Its
  // manifest must declare the same fields and label field (format 2) or
  // dtype and shape (format 1), and not be a part. Records continue after
  // its last one in new shard files: no existing shard is opened for
  // writing. The old manifest stays in place while the append runs (a
  // reader opening DIR meanwhile sees the old records); Finish publishes
  // the new one atomically with an `appends` entry. Shards beyond the
  // manifest's, left by an interrupted append, are resumed like `resume`
  // resumes (next_index() says where). `first_index` and `resume` are
  // ignored.
  bool append = false;
  std::string append_from;  // the appends entry's "from": what was appended
  // Format 2: records in packs of about this many bytes (kiln/record.h,
  // Manifest::pack_bytes), so that LMDB's page rounding is paid once a pack
  // instead of once a record; 0: a value a record. kAutoPack: packs of
  // kDefaultPackBytes where a field is encoded (records of tens of KB),
  // none otherwise. An append packs as the cache it appends to.
  static constexpr uint64_t kAutoPack = ~uint64_t{0};
  static constexpr uint64_t kDefaultPackBytes = 1ull << 20;
  uint64_t pack_bytes = kAutoPack;
};

class CacheWriter {
 public:
  // Opens DIR (created if absent) for writing. Removes DIR/manifest.json
  // first, so the cache never looks complete while it is being written.
  // Without `resume`, DIR must hold no shard (InvalidArgument otherwise).
  // With `resume`, the existing shards are checked (contiguous keys, sane
  // headers, dtype/shape as in options) and writing continues after them.
  // Returns IOError ("in use") when another writer holds DIR's lock.
  static Status Open(const WriterOptions& options, const std::string& dir,
                     std::unique_ptr<CacheWriter>* out);
  ~CacheWriter();  // commits nothing further; committed records stay

  // The index the next Append must use (first_index for a new cache).
  uint64_t next_index() const;
  // Appending: the record count of the cache before this append (0 when
  // not appending).
  uint64_t append_base() const;

  // Appends one record. REQUIRES: index == next_index(); payload holds
  // shape x dtype bytes. The payload is copied before Append returns.
  Status Append(uint64_t index, int64_t label, const void* payload);

  // Appends one version 2 record (a writer opened with `fields`): one
  // FieldData per declared field, in their order, each of the declared
  // dtype and ndim with the declared fixed sizes. REQUIRES: index ==
  // next_index(). Returns InvalidArgument naming the record and the field
  // that does not fit, writing nothing. The data is copied before it
  // returns.
  Status AppendFields(uint64_t index, const FieldData* fields, int n);

  // Commits what is pending (the records become durable once synced).
  Status Commit();

  // Commits and syncs every shard, then writes DIR/manifest.json from
  // `meta` (its classes and preprocessing_json are kept; count, shards,
  // dtype, shape and versions are filled in here). `meta` receives the
  // manifest written. The writer cannot be used afterwards. Appending:
  // `meta`'s classes must start with the cache's (empty keeps them; new
  // names may follow), its recipe must make tensors as the cache's does or
  // be empty: a complete recipe (kiln build's, with the grown sources)
  // replaces the cache's, another keeps it. InvalidArgument saying what
  // differs otherwise, with the old manifest left in place.
  Status Finish(Manifest* meta);

 private:
  class Impl;  // the implementation (the .cc file)
  explicit CacheWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A JPEG for field `spec` (codec jpeg, uint8 C x H x W): checks that the
// `size` bytes at `jpeg` decode whole, with the field's channels (a
// grayscale JPEG for C 1, YCbCr or RGB for C 3) and fixed sizes, and sets
// *shape to its C x H x W. InvalidArgument saying what does not fit.
Status CheckJpegForField(const FieldSpec& spec, const uint8_t* jpeg, size_t size, Shape* shape);
// The uint8 C x H x W image `chw` (C 1 or 3) as a JPEG of `quality` (1..100,
// 4:2:0 chroma) into *out: what kiln build --encode and kiln.Writer store.
Status EncodeJpegCHW(const uint8_t* chw, const Shape& shape, int quality, std::vector<uint8_t>* out);
// The quality kiln.Writer encodes arrays given for a JPEG field with.
inline constexpr int kDefaultJpegQuality = 90;

// Removes DIR/manifest.json, if there, so that DIR no longer looks like a
// complete cache. REQUIRES: DIR's lock is held.
Status RemoveManifest(const std::string& dir);

// A replacement for one record of a finished cache.
struct RecordFix {
  uint64_t index = 0;
  // Format 1: the label and the manifest's shape x dtype payload bytes.
  int64_t label = -1;
  const void* payload = nullptr;
  // Format 2: every field of the record, in the manifest's order (the
  // data must outlive RewriteRecords).
  std::vector<FieldData> fields;
};

// Rewrites the given records of the finished cache in DIR in place (under
// the directory lock): each affected shard gets the new values (a deleted
// record is put back), is written again in the canonical layout (the
// manifest's `layout`: the bytes of a fresh build), and the manifest's sizes and
// digests are recomputed, through the usual temp file + rename. Records not
// listed are not touched. Returns InvalidArgument for an index outside the
// cache or a format 2 fix whose fields do not fit the manifest's (naming
// the record and the field), IOError when the cache is in use.
Status RewriteRecords(const std::string& dir, const std::vector<RecordFix>& fixes);

}  // namespace kiln

#endif  // KILN_CACHE_WRITER_H_
