#include "kiln/cache_reader.h"

#include "kiln/file.h"
#include "core/lmdb_check.h"
#include "core/lmdb_env.h"

namespace kiln {

class CacheReader::ShardEnv {
 public:
  std::shared_ptr<const LmdbEnv> env;  // shared with other readers of the file
};

struct ReadTxn::Shard {
  LmdbTxn txn;
  bool active = false;
  bool begun = false;
};

CacheReader::~CacheReader() = default;

Status CacheReader::Open(const std::string& dir, const ReaderOptions& options,
                         std::unique_ptr<CacheReader>* out) {
  std::unique_ptr<CacheReader> r(new CacheReader());
  r->dir_ = dir;
  KILN_RETURN_IF_ERROR(ReadManifest(dir, &r->manifest_));
  if (r->manifest_.is_part() && !options.allow_part)
    return Status::NotSupported(
        dir + ": is part " + std::to_string(r->manifest_.part_index) + " (from 0) of " +
        std::to_string(r->manifest_.part_count) +
        " of a cache built with --num-parts; join the parts first: kiln merge OUT PART...");
  for (const ShardInfo& s : r->manifest_.shards) {
    const std::string path = dir + "/" + s.file;
    uint64_t size = 0;
    Status st = FileSize(path, &size);
    if (st.IsNotFound())
      return Status::Corruption(path + ": shard missing (the manifest lists it with " +
                                std::to_string(s.count) + " records from index " +
                                std::to_string(s.first) + "); rebuild or restore it");
    KILN_RETURN_IF_ERROR(st);
    if (size != s.bytes)
      return Status::Corruption(path + ": shard is " + std::to_string(size) +
                                " bytes, the manifest says " + std::to_string(s.bytes) +
                                (size < s.bytes ? " (truncated)" : " (modified)"));
    // LMDB trusts its pages: damaged ones would crash this process inside
    // LMDB (core/lmdb_check.h). The tree walk reads the branch and leaf
    // pages and checks overflow values by arithmetic; kiln verify reads
    // their headers too.
    LmdbFileSummary structure;
    st = CheckLmdbFile(path, size, LmdbWalk::kTree, &structure);
    if (st.IsCorruption())
      return Status::Corruption(st.message() + "; rebuild the cache (kiln build --force) or "
                                "restore the shard");
    KILN_RETURN_IF_ERROR(st);
    auto env = std::make_unique<ShardEnv>();
    KILN_RETURN_IF_ERROR(OpenSharedForRead(path, options.max_readers, &env->env)
                             .WithContext("opening shard"));
    // The walk counted the entries (and matched the meta page's count).
    if (structure.entries != s.count)
      return Status::Corruption(path + ": shard holds " + std::to_string(structure.entries) +
                                " records, the manifest says " + std::to_string(s.count));
    r->envs_.push_back(std::move(env));
  }
  *out = std::move(r);
  return Status::OK();
}

std::unique_ptr<ReadTxn> CacheReader::BeginRead() const {
  return std::unique_ptr<ReadTxn>(new ReadTxn(this));
}

ReadTxn::ReadTxn(const CacheReader* reader) : reader_(reader) {
  // Every shard's slot is made now, so that Get never allocates.
  shards_.resize(reader->manifest().shards.size());
  for (auto& s : shards_) s = std::make_unique<Shard>();
}

ReadTxn::~ReadTxn() = default;

void ReadTxn::Reset() {
  for (auto& s : shards_) {
    if (s->active) {
      s->txn.Reset();
      s->active = false;
    }
  }
}

Status ReadTxn::Get(uint64_t index, RecordView* out, bool verify_checksum) {
  const Manifest& m = reader_->manifest();
  const int si = m.ShardFor(index);
  if (si < 0)
    return Status::NotFound("record " + std::to_string(index) + " is past the end of the cache (" +
                            std::to_string(m.count) + " records)");
  const LmdbEnv& env = *reader_->shard_env(si).env;
  auto& shard = shards_[si];
  if (!shard->begun) {
    KILN_RETURN_IF_ERROR(shard->txn.Begin(env, /*read_only=*/true));
    shard->begun = shard->active = true;
  } else if (!shard->active) {
    KILN_RETURN_IF_ERROR(shard->txn.Renew());
    shard->active = true;
  }
  uint8_t key[kKeySize];
  EncodeKey(index, key);
  MDB_val k{kKeySize, key}, v;
  int rc = mdb_get(shard->txn.get(), env.dbi(), &k, &v);
  if (rc == MDB_NOTFOUND)
    return Status::Corruption(env.path() + ": record " + std::to_string(index) +
                              " missing from its shard");
  // The context string is built only on failure: Get allocates nothing.
  if (rc != MDB_SUCCESS) return LmdbStatus(rc, env.path() + ": record " + std::to_string(index));
  const uint8_t* value = static_cast<const uint8_t*>(v.mv_data);
  RecordHeader h;
  KILN_RETURN_IF_ERROR(DecodeRecordHeader(index, value, v.mv_size, &h).WithContext(env.path()));
  if (h.dtype != m.dtype || h.shape != m.shape)
    return Status::Corruption(env.path() + ": record " + std::to_string(index) + " is " +
                              DTypeName(h.dtype) + " " + h.shape.ToString() +
                              ", the manifest says " + DTypeName(m.dtype) + " " +
                              m.shape.ToString());
  if (!m.classes.empty() && (h.label < 0 || h.label >= static_cast<int64_t>(m.classes.size())))
    return Status::Corruption(env.path() + ": record " + std::to_string(index) + " has label " +
                              std::to_string(h.label) + ", outside the " +
                              std::to_string(m.classes.size()) + " classes");
  if (verify_checksum)
    KILN_RETURN_IF_ERROR(VerifyRecordChecksum(index, value, h).WithContext(env.path()));
  out->index = index;
  out->data = value + kRecordHeaderSize;
  out->bytes = h.payload_bytes;
  out->dtype = h.dtype;
  out->shape = h.shape;
  out->label = h.label;
  out->checksum = h.checksum;
  return Status::OK();
}

}  // namespace kiln
