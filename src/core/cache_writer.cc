#include "kiln/cache_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/file.h"
#include "core/lmdb_env.h"
#include "core/shard_digest.h"
#include "core/shard_write.h"
#include "core/units.h"
#include "kiln/cache_layout.h"
#include "kiln/dir_lock.h"

namespace kiln {

namespace {

// Marks a shard whose writes were committed off the regular cadence (an
// explicit Commit): it is rewritten canonically when it is finished.
std::string ReplayMarker(const std::string& shard_path) { return shard_path + kReplaySuffix; }

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}
}  // namespace

class CacheWriter::Impl {
 public:
  Impl(WriterOptions o, std::string dir) : opt_(std::move(o)), dir_(std::move(dir)) {
    v2_ = !opt_.fields.empty();
    next_ = opt_.first_index;
    if (v2_) {
      bool encoded = false;
      for (const FieldSpec& f : opt_.fields) encoded = encoded || f.codec != Codec::kRaw;
      pack_bytes_ = opt_.pack_bytes != WriterOptions::kAutoPack ? opt_.pack_bytes
                    : encoded                                   ? WriterOptions::kDefaultPackBytes
                                                                : 0;
      max_dims_.assign(opt_.fields.size(), {});
      for (size_t f = 0; f < opt_.fields.size(); ++f)
        for (int i = 0; i < opt_.fields[f].ndim; ++i)
          if (opt_.fields[f].dims[i] != FieldSpec::kVariableDim)
            max_dims_[f][i] = static_cast<uint32_t>(opt_.fields[f].dims[i]);
      return;  // pending_ grows to the largest commit's bytes
    }
    record_bytes_ = opt_.shape.NumElements() * DTypeSize(opt_.dtype);
    // Sized once: the records of one commit, reused for every commit.
    pending_.resize(PerCommit() * (kRecordHeaderSize + record_bytes_));
  }
  ~Impl() { env_.Close(); }

  Status Init() {
    if (opt_.lock == nullptr) {
      KILN_RETURN_IF_ERROR(DirLock::Acquire(dir_, &own_lock_));
    } else if (opt_.lock->dir() != dir_) {
      return Status::InvalidArgument(dir_ + ": the lock handed to the writer is " +
                                     opt_.lock->dir() + "'s");
    }
    if (opt_.append) return InitAppend();
    // The cache must not look complete while it changes.
    KILN_RETURN_IF_ERROR(RemoveManifest(dir_));
    if (!opt_.resume) {
      if (Exists(dir_ + "/" + ShardFileName(0)))
        return Status::InvalidArgument(dir_ + ": already holds shards; remove it or resume");
      return OpenShard(0, /*fresh=*/true);
    }
    return ScanExisting();
  }

  // Appending: the finished cache's manifest is the base; its records and
  // shards stay as they are, new records go into shards after its last.
  Status InitAppend() {
    const Status read = ReadManifest(dir_, &base_);
    if (read.IsIncomplete())
      return Status::InvalidArgument(dir_ + ": not a finished cache (no manifest.json); finish "
                                     "or resume its build first, then append");
    KILN_RETURN_IF_ERROR(read);
    if (base_.is_part())
      return Status::InvalidArgument(dir_ + ": is part " + std::to_string(base_.part_index) +
                                     " of a build in parts; merge the parts, then append");
    KILN_RETURN_IF_ERROR(CheckBaseFits());
    appending_ = true;
    next_ = base_.first_index + base_.count;
    pack_bytes_ = base_.pack_bytes;
    if (v2_)
      for (size_t f = 0; f < opt_.fields.size(); ++f)
        for (int i = 0; i < opt_.fields[f].ndim; ++i)
          max_dims_[f][i] = std::max(max_dims_[f][i], base_.fields[f].max_dims[i]);
    done_ = base_.shards;
    // Says (to verify) that the shards after the manifest's are this append's.
    // Written atomically: a resumed append rewrites it while an earlier
    // attempt's shards are there, and a kill must not leave it empty.
    KILN_RETURN_IF_ERROR(WriteFileAtomic(
        dir_, kAppendMarkerName, std::string(kAppendMarkerName) + ".tmp",
        nlohmann::json{{"count_before", base_.count}, {"from", opt_.append_from}}.dump() + "\n"));
    return ScanExisting(static_cast<int>(base_.shards.size()));
  }

  // Whether the records this writer writes are the base cache's kind.
  Status CheckBaseFits() const {
    const std::string refuse = dir_ + ": cannot append: ";
    if (!v2_) {
      if (base_.format_version != kFormatVersion)
        return Status::InvalidArgument(refuse + "the cache holds format 2 records (fields), this "
                                                "writer writes format 1 (one tensor and a label)");
      if (base_.dtype != opt_.dtype || base_.shape != opt_.shape)
        return Status::InvalidArgument(refuse + "the cache holds " + DTypeName(base_.dtype) + " " +
                                       base_.shape.ToString() + " records, this writer writes " +
                                       DTypeName(opt_.dtype) + " " + opt_.shape.ToString());
      return Status::OK();
    }
    if (base_.format_version != kFormatVersion2)
      return Status::InvalidArgument(refuse + "the cache holds format 1 records, this writer "
                                              "declares fields (format 2)");
    auto text = [](const std::vector<FieldSpec>& fields) {
      std::string t;
      for (const FieldSpec& f : fields)
        t += (t.empty() ? "" : ", ") + f.name + " " + DTypeName(f.dtype) + " " + f.ShapeText() +
             (f.codec != Codec::kRaw ? std::string(" ") + CodecName(f.codec) : "");
      return t;
    };
    if (text(base_.fields) != text(opt_.fields))
      return Status::InvalidArgument(refuse + "its fields are [" + text(base_.fields) +
                                     "], this writer declares [" + text(opt_.fields) + "]");
    const std::string base_label =
        base_.label_field >= 0 ? base_.fields[base_.label_field].name : std::string();
    if (base_label != opt_.label_field)
      return Status::InvalidArgument(refuse + "its label field is '" + base_label +
                                     "', this writer's is '" + opt_.label_field + "'");
    return Status::OK();
  }

  // Re-reads the committed shards from shard s0 on (those before it are the
  // base cache's, when appending) to find where to continue and to rebuild
  // the running shard digests.
  Status ScanExisting(int s0 = 0) {
    int i = s0;
    while (Exists(dir_ + "/" + ShardFileName(i + 1))) ++i;
    for (int s = s0; s <= i; ++s) {
      const std::string path = dir_ + "/" + ShardFileName(s);
      if (!Exists(path)) {
        if (s == s0) return OpenShard(s0, true);
        return Status::Corruption(path + ": missing while later shards exist");
      }
      // The map size recorded in the file, so that the resumed shard goes on
      // exactly as the interrupted writer would have.
      KILN_RETURN_IF_ERROR(env_.OpenForWrite(path, 0));
      ShardInfo info;
      info.file = ShardFileName(s);
      info.first = next_;
      ShardDigest digest;
      uint64_t scanned_bytes = 0;  // what shard_bytes_ counts
      uint64_t values = 0;         // LMDB entries (packs)
      LmdbTxn txn;
      KILN_RETURN_IF_ERROR(txn.Begin(env_, true));
      Status st;
      const Status read = ForEachRecord(env_, txn, [&](const MDB_val& k, const MDB_val& v) {
        const uint64_t idx = k.mv_size == kKeySize ? DecodeKey(static_cast<uint8_t*>(k.mv_data)) : ~0ull;
        RecordHeader h;
        if (idx != next_) {
          st = Status::Corruption(path + ": expected record " + std::to_string(next_) +
                                  ", found key " + std::to_string(idx) + "; cannot resume");
        } else {
          st = DecodeRecordHeader(idx, static_cast<uint8_t*>(v.mv_data), v.mv_size, &h)
                   .WithContext(path);
          if (st.ok() && v2_) {
            st = AdmitStored(path, idx, h);
          } else if (st.ok() && h.version != kRecordVersion) {
            st = Status::InvalidArgument(path + ": holds version " + std::to_string(h.version) +
                                         " records, this build writes version 1");
          } else if (st.ok() && (h.dtype != opt_.dtype || h.shape != opt_.shape))
            st = Status::InvalidArgument(path + ": holds " + DTypeName(h.dtype) + " " +
                                         h.shape.ToString() + " records, this build writes " +
                                         DTypeName(opt_.dtype) + " " + opt_.shape.ToString());
        }
        if (!st.ok()) return false;
        digest.Add(h.checksum);
        ++next_;
        ++info.count;
        scanned_bytes += v2_ ? v.mv_size : record_bytes_;
        return true;
      }, &values);
      if (pack_bytes_ > 0) info.values = values;
      KILN_RETURN_IF_ERROR(st);
      KILN_RETURN_IF_ERROR(read);
      txn.Abort();
      if (s < i) {
        info.digest = digest.Hex();
        KILN_RETURN_IF_ERROR(FinishShardFile(&info));
        done_.push_back(info);
      } else {
        // A shard reopened with records in it is rewritten at its end: LMDB's
        // page layout after a reopen (following a kill -9 mid-commit, say)
        // need not be the one an uninterrupted writer leaves.
        noncanonical_ = info.count > 0 || Exists(ReplayMarker(path));
        cur_ = info;
        digest_ = digest;
        shard_index_ = s;
        shard_bytes_ = scanned_bytes;
      }
    }
    return Status::OK();
  }

  // The map a fresh shard starts with.
  uint64_t InitialMapSize() const {
    return opt_.initial_map_size ? opt_.initial_map_size
                                 : opt_.shard_size + opt_.shard_size / 4 + (64ull << 20);
  }
  // Records per commit: the first record that takes the batch to
  // commit_bytes closes it.
  uint64_t PerCommit() const {
    const uint64_t stride = kRecordHeaderSize + record_bytes_;
    return std::max<uint64_t>(1, (opt_.commit_bytes + stride - 1) / stride);
  }

  Status OpenShard(int i, bool fresh) {
    shard_index_ = i;
    const std::string path = dir_ + "/" + ShardFileName(i);
    if (fresh) {
      ::unlink(path.c_str());
      ::unlink((path + kLmdbLockSuffix).c_str());
    }
    ::unlink(ReplayMarker(path).c_str());
    KILN_RETURN_IF_ERROR(env_.OpenForWrite(path, InitialMapSize()));
    cur_ = ShardInfo();
    cur_.file = ShardFileName(i);
    cur_.first = next_;
    digest_.Reset();
    shard_bytes_ = 0;
    return Status::OK();
  }

  Status Append(uint64_t index, int64_t label, const void* payload) {
    if (index != next_)
      return Status::InvalidArgument("record " + std::to_string(index) +
                                     " appended out of order; expected " + std::to_string(next_));
    if (shard_bytes_ > 0 && shard_bytes_ + record_bytes_ > opt_.shard_size) {
      KILN_RETURN_IF_ERROR(RollOver());
    }
    // The record is kept in pending_ so that a batch killed by MDB_MAP_FULL
    // can be redone after the map grows.
    uint8_t* h = pending_.data() + pending_count_ * (kRecordHeaderSize + record_bytes_);
    std::memcpy(h + kRecordHeaderSize, payload, record_bytes_);
    EncodeRecordHeader(index, opt_.dtype, opt_.shape, label, h + kRecordHeaderSize, h);
    pending_first_ = pending_count_ == 0 ? index : pending_first_;
    ++pending_count_;
    ++next_;
    shard_bytes_ += record_bytes_;
    if (pending_count_ >= PerCommit()) return CommitPending();
    return Status::OK();
  }

  // A version 2 record (opened with fields).
  Status AppendFields(uint64_t index, const FieldData* fields, int n) {
    if (!v2_)
      return Status::InvalidArgument(
          "writer: opened for version 1 records (no fields declared); "
          "use Append");
    if (index != next_)
      return Status::InvalidArgument("record " + std::to_string(index) +
                                     " appended out of order; expected " + std::to_string(next_));
    KILN_RETURN_IF_ERROR(CheckFieldsFit(opt_.fields, index, fields, n));
    const uint64_t size = RecordV2Size(fields, n);
    if (shard_bytes_ > 0 && shard_bytes_ + size > opt_.shard_size) {
      KILN_RETURN_IF_ERROR(RollOver());
    }
    const uint64_t at = pending_used_;
    if (pending_.size() < at + size) pending_.resize(at + size);
    EncodeRecordV2(index, fields, n, pending_.data() + at);
    pending_offsets_.push_back(at);
    pending_used_ += size;
    for (int f = 0; f < n; ++f)
      for (int i = 0; i < fields[f].shape.ndim; ++i)
        max_dims_[f][i] = std::max(max_dims_[f][i], fields[f].shape.dims[i]);
    pending_first_ = pending_count_ == 0 ? index : pending_first_;
    ++pending_count_;
    ++next_;
    shard_bytes_ += size;
    if (pending_used_ >= opt_.commit_bytes) return CommitPending();
    return Status::OK();
  }

  // A stored version 2 record found on resume: one of the declared fields'
  // (its sizes count towards the fields' largest).
  Status AdmitStored(const std::string& path, uint64_t idx, const RecordHeader& h) {
    if (h.version != kRecordVersion2 || h.num_fields != static_cast<int>(opt_.fields.size()))
      return Status::InvalidArgument(path + ": record " + std::to_string(idx) +
                                     " is not a record of the fields this writer declares; "
                                     "cannot resume");
    for (int f = 0; f < h.num_fields; ++f) {
      const FieldEntry& e = h.fields[f];
      if (!opt_.fields[f].Admits(e.dtype, e.shape, e.codec))
        return Status::InvalidArgument(
            path + ": record " + std::to_string(idx) + ", field '" + opt_.fields[f].name + "' is " +
            DTypeName(e.dtype) + " " + e.shape.ToString() + ", this writer declares " +
            DTypeName(opt_.fields[f].dtype) + " " + opt_.fields[f].ShapeText() + "; cannot resume");
      for (int i = 0; i < e.shape.ndim; ++i)
        max_dims_[f][i] = std::max(max_dims_[f][i], e.shape.dims[i]);
    }
    return Status::OK();
  }

  // An explicit commit (CacheWriter::Commit): durable now, but off the
  // regular cadence, so the shard is rewritten canonically at its end.
  Status Commit() {
    if (pending_count_ == 0) return Status::OK();
    if (!noncanonical_) {
      std::ofstream marker(ReplayMarker(env_.path()));
      if (!marker) return Status::IOError(ReplayMarker(env_.path()) + ": cannot create");
      noncanonical_ = true;
    }
    return CommitPending();
  }

  Status CommitPending() {
    if (pending_count_ == 0) return Status::OK();
    if (v2_) return CommitPendingV2();
    const size_t stride = kRecordHeaderSize + record_bytes_;
    KILN_RETURN_IF_ERROR(CommitBatch(&env_, pending_first_, pending_count_,
                                     [&](uint64_t i, MDB_val* v) {
                                       *v = MDB_val{stride, pending_.data() + (i - pending_first_) * stride};
                                       return Status::OK();
                                     }));
    KILN_RETURN_IF_ERROR(AfterCommit());
    for (uint64_t r = 0; r < pending_count_; ++r) {
      digest_.Add(pending_.data() + r * stride + kChecksumOffset);
    }
    cur_.count += pending_count_;
    pending_count_ = 0;
    return Status::OK();
  }

  // After a commit: the fsync of sync_commits, or else the start of the
  // committed pages' write-back, without waiting, so that the one fsync at
  // the end of the shard has little left to do.
  Status AfterCommit() {
    if (opt_.sync_commits) return LmdbStatus(mdb_env_sync(env_.env(), 1), env_.path());
    mdb_filehandle_t fd;
    if (mdb_env_get_fd(env_.env(), &fd) == MDB_SUCCESS)
      (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    return Status::OK();
  }

  Status CommitPendingV2() {
    pending_offsets_.push_back(pending_used_);  // the end of the last
    uint64_t put = 0;
    Status st = CommitBatch(
        &env_, pending_first_, pending_count_,
        [&](uint64_t i, MDB_val* v) {
          const uint64_t r = i - pending_first_;
          *v = MDB_val{pending_offsets_[r + 1] - pending_offsets_[r],
                       pending_.data() + pending_offsets_[r]};
          return Status::OK();
        },
        pack_bytes_, &put);
    pending_offsets_.pop_back();
    KILN_RETURN_IF_ERROR(st);
    KILN_RETURN_IF_ERROR(AfterCommit());
    for (uint64_t off : pending_offsets_) digest_.Add(pending_.data() + off + kChecksumOffsetV2);
    cur_.count += pending_count_;
    if (pack_bytes_ > 0) cur_.values += put;
    pending_count_ = 0;
    pending_used_ = 0;
    pending_offsets_.clear();
    return Status::OK();
  }

  // Syncs and closes the shard held in env_ and records its size. A shard
  // written in one go on the regular commit cadence is already canonical;
  // one that saw an explicit Commit, or was resumed, is rewritten.
  Status FinishShardFile(ShardInfo* info) {
    const std::string path = env_.path();
    if (noncanonical_ || Exists(ReplayMarker(path))) {
      Status s;
      uint64_t values = 0;
      {  // the snapshot and its cursor end before the shard is closed
        LmdbTxn rd;
        KILN_RETURN_IF_ERROR(rd.Begin(env_, true));
        PackCursor cursor;
        s = WriteShardCanonically(
            path + ".canonical", InitialMapSize(), v2_ ? 0 : PerCommit(), info->first,
            info->count,
            [&](uint64_t i, MDB_val* v) {
              return FindRecord(env_, rd.get(), i, pack_bytes_ > 0, &cursor, v)
                  .WithContext(path + ": record " + std::to_string(i));
            },
            opt_.commit_bytes, pack_bytes_, &values);
      }
      if (pack_bytes_ > 0) info->values = values;
      KILN_RETURN_IF_ERROR(s);
      env_.Close();
      ::unlink((path + kLmdbLockSuffix).c_str());
      if (::rename((path + ".canonical").c_str(), path.c_str()) != 0) return PosixError(path, errno);
      ::unlink(ReplayMarker(path).c_str());
      noncanonical_ = false;
    } else {
      KILN_RETURN_IF_ERROR(SyncAndClose(&env_));
    }
    return FileSize(path, &info->bytes);
  }

  Status CloseCurrent() {
    KILN_RETURN_IF_ERROR(CommitPending());
    cur_.digest = digest_.Hex();
    KILN_RETURN_IF_ERROR(FinishShardFile(&cur_));
    done_.push_back(cur_);
    return Status::OK();
  }

  Status RollOver() {
    KILN_RETURN_IF_ERROR(CloseCurrent());
    return OpenShard(shard_index_ + 1, /*fresh=*/true);
  }

  Status Finish(Manifest* meta) {
    if (appending_ && next_ == base_.first_index + base_.count) {
      // Nothing appended: the cache stays as it was, without an empty shard.
      const std::string path = env_.path();
      env_.Close();
      ::unlink(path.c_str());
      ::unlink((path + kLmdbLockSuffix).c_str());
      ::unlink(ReplayMarker(path).c_str());
      ::unlink((dir_ + "/" + kAppendMarkerName).c_str());
      *meta = base_;
      return Status::OK();
    }
    // An append that does not fit is refused before its shards are closed.
    if (appending_) KILN_RETURN_IF_ERROR(AppendMeta(meta));
    KILN_RETURN_IF_ERROR(CloseCurrent());
    // A shard left by an earlier, longer attempt must not linger.
    for (int i = shard_index_ + 1; Exists(dir_ + "/" + ShardFileName(i)); ++i)
      ::unlink((dir_ + "/" + ShardFileName(i)).c_str());
    meta->kiln_version = KilnVersion();
    meta->count = next_ - FirstIndex();
    meta->first_index = FirstIndex();
    meta->shards = done_;
    meta->initial_map_size = InitialMapSize();
    if (v2_) {
      meta->format_version = kFormatVersion2;
      meta->fields = opt_.fields;
      for (size_t f = 0; f < meta->fields.size(); ++f) meta->fields[f].max_dims = max_dims_[f];
      KILN_RETURN_IF_ERROR(CheckFieldSpecs(meta->fields, opt_.label_field, dir_, &meta->image_field,
                                           &meta->label_field));
      const FieldSpec& image = meta->fields[meta->image_field];
      meta->dtype = image.dtype;
      meta->shape = image.fixed() ? image.FixedShape() : Shape{};
      meta->commit_records = 0;
      meta->commit_bytes = opt_.commit_bytes;
      meta->pack_bytes = pack_bytes_;
    } else {
      meta->format_version = kFormatVersion;
      meta->dtype = opt_.dtype;
      meta->shape = opt_.shape;
      SetFormat1Fields(meta);
      meta->commit_records = PerCommit();
    }
    KILN_RETURN_IF_ERROR(WriteManifest(dir_, *meta));
    if (appending_) ::unlink((dir_ + "/" + kAppendMarkerName).c_str());
    return Status::OK();
  }

  uint64_t next() const { return next_; }
  uint64_t append_base() const { return appending_ ? base_.count : 0; }

 private:
  uint64_t FirstIndex() const { return appending_ ? base_.first_index : opt_.first_index; }

  // Finishing an append: the base's classes (extended by new names at the
  // end), recipe and earlier appends, and this append's entry.
  Status AppendMeta(Manifest* meta) const {
    const std::string refuse = dir_ + ": cannot append: ";
    if (meta->classes.empty()) {
      meta->classes = base_.classes;
    } else if (meta->classes.size() < base_.classes.size() ||
               !std::equal(base_.classes.begin(), base_.classes.end(), meta->classes.begin())) {
      return Status::InvalidArgument(
          refuse + "the new records' classes must begin with the cache's " +
          std::to_string(base_.classes.size()) +
          " classes in their order (new names may follow); the labels would name other classes");
    }
    // A complete recipe (kiln build's) describes the grown cache, its
    // sources included, and replaces the cache's; another one is checked
    // against it.
    const bool replaces = meta->preprocessing.complete;
    if (!(meta->preprocessing == Preprocessing())) {
      Manifest a = base_, b = base_;
      b.preprocessing = meta->preprocessing;
      const std::vector<std::string> diff = PreprocessingDifferences(a, b);
      if (!diff.empty()) {
        std::string d;
        for (const std::string& x : diff) d += (d.empty() ? "" : "; ") + x;
        return Status::InvalidArgument(refuse + "the new records were made another way (" + d +
                                       "); rebuild the cache with one recipe");
      }
    }
    if (!replaces) meta->preprocessing = base_.preprocessing;
    meta->appends = base_.appends;
    AppendEntry e;
    e.count_before = base_.count;
    e.count_after = next_ - FirstIndex();
    e.from = opt_.append_from;
    e.time = UtcNowIso8601();
    meta->appends.push_back(std::move(e));
    return Status::OK();
  }


  WriterOptions opt_;
  std::string dir_;
  std::unique_ptr<DirLock> own_lock_;  // when the caller handed none
  uint64_t record_bytes_ = 0;
  LmdbEnv env_;
  int shard_index_ = 0;
  ShardInfo cur_;
  ShardDigest digest_;
  uint64_t shard_bytes_ = 0;
  std::vector<ShardInfo> done_;
  std::vector<uint8_t> pending_;
  uint64_t pending_first_ = 0;
  uint64_t pending_count_ = 0;
  // Version 2: where each pending record starts in pending_, and the bytes
  // pending_ holds; the largest size each field's dims took.
  bool v2_ = false;
  std::vector<uint64_t> pending_offsets_;
  uint64_t pending_used_ = 0;
  std::vector<std::array<uint32_t, kMaxDims>> max_dims_;
  uint64_t next_ = 0;
  bool noncanonical_ = false;  // the current shard saw an explicit Commit
  // Appending: the finished cache's manifest as it was opened.
  bool appending_ = false;
  Manifest base_;
  uint64_t pack_bytes_ = 0;  // resolved WriterOptions::pack_bytes (version 2 only)
};

Status RemoveManifest(const std::string& dir) {
  const std::string manifest = dir + "/" + kManifestName;
  if (Exists(manifest) && ::unlink(manifest.c_str()) != 0) return PosixError(manifest, errno);
  return Status::OK();
}

CacheWriter::CacheWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CacheWriter::~CacheWriter() = default;

Status CacheWriter::Open(const WriterOptions& options, const std::string& dir,
                         std::unique_ptr<CacheWriter>* out) {
  if (!options.fields.empty()) {
    int image = 0, label = -1;
    KILN_RETURN_IF_ERROR(
        CheckFieldSpecs(options.fields, options.label_field, "writer", &image, &label));
    if (options.shard_size == 0) return Status::InvalidArgument("writer: shard size must be > 0");
    if (options.commit_bytes == 0)
      return Status::InvalidArgument("writer: commit_bytes must be > 0");
    auto impl = std::make_unique<Impl>(options, dir);
    KILN_RETURN_IF_ERROR(impl->Init());
    out->reset(new CacheWriter(std::move(impl)));
    return Status::OK();
  }
  if (options.shape.ndim < 1 || options.shape.ndim > kMaxDims || options.shape.NumElements() == 0)
    return Status::InvalidArgument("writer: record shape must have 1.." +
                                   std::to_string(kMaxDims) + " nonzero dims");
  if (DTypeSize(options.dtype) == 0) return Status::InvalidArgument("writer: unknown dtype");
  if (options.shard_size == 0) return Status::InvalidArgument("writer: shard size must be > 0");
  auto impl = std::make_unique<Impl>(options, dir);
  KILN_RETURN_IF_ERROR(impl->Init());
  out->reset(new CacheWriter(std::move(impl)));
  return Status::OK();
}

uint64_t CacheWriter::next_index() const { return impl_->next(); }
uint64_t CacheWriter::append_base() const { return impl_->append_base(); }
Status CacheWriter::Append(uint64_t index, int64_t label, const void* payload) {
  return impl_->Append(index, label, payload);
}
Status CacheWriter::AppendFields(uint64_t index, const FieldData* fields, int n) {
  return impl_->AppendFields(index, fields, n);
}
Status CacheWriter::Commit() { return impl_->Commit(); }
Status CacheWriter::Finish(Manifest* meta) {
  if (!impl_) return Status::InvalidArgument("writer already finished");
  Status s = impl_->Finish(meta);
  impl_.reset();
  return s;
}

}  // namespace kiln
