#include "kiln/cache_reader.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/file.h"
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
  // For a shard of packs: finds the pack before a key (FindRecord), renewed
  // with the snapshot. Declared after txn, so closed before it.
  PackCursor cursor;
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
    st = CheckLmdbFile(path, size, &structure);
    if (st.IsCorruption())
      return Status::Corruption(st.message() + "; rebuild the cache (kiln build --force) or "
                                "restore the shard");
    KILN_RETURN_IF_ERROR(st);
    auto env = std::make_unique<ShardEnv>();
    KILN_RETURN_IF_ERROR(OpenSharedForRead(path, options.max_readers, &env->env)
                             .WithContext("opening shard"));
    // The walk counted the entries (and matched the meta page's count).
    // (A shard of packs: its LMDB entries, ShardInfo::values.)
    if (structure.entries != (s.values ? s.values : s.count))
      return Status::Corruption(
          path + ": shard holds " + std::to_string(structure.entries) +
          (s.values ? " values (packs of records), the manifest says " + std::to_string(s.values)
                    : " records, the manifest says " + std::to_string(s.count)));
    r->envs_.push_back(std::move(env));
  }
  const Manifest& m = r->manifest_;
  for (const ShardInfo& s : m.shards)
    if (!s.label_map.empty()) {
      for (size_t c = 0; c < m.classes.size(); ++c) {
        r->class_values64_.push_back(static_cast<int64_t>(c));
        r->class_values32_.push_back(static_cast<int32_t>(c));
      }
      break;
    }
  if (m.format_version == kFormatVersion2) {
    bool fixed = true;
    std::vector<Shape> shapes(m.fields.size());
    std::vector<FieldData> fields(m.fields.size());
    for (size_t f = 0; f < m.fields.size(); ++f) {
      // An encoded field's length varies whatever its shape.
      fixed = fixed && m.fields[f].fixed() && m.fields[f].codec == Codec::kRaw;
      if (!fixed) break;
      fields[f] = {m.fields[f].dtype, m.fields[f].FixedShape(), nullptr};
    }
    if (fixed) {
      const int n = static_cast<int>(fields.size());
      r->value_bytes_ = RecordV2Size(fields.data(), n);
      r->image_offset_ = RecordV2Size(fields.data(), m.image_field + 1) - r->record_bytes();
      // RecordV2Size of the first k fields counts a table of k entries.
      r->image_offset_ += kFieldEntrySize * (n - m.image_field - 1);
      r->read_header_bytes_ = r->value_bytes_ - r->record_bytes();
    } else {
      r->read_header_bytes_ = 0;
    }
  }
  *out = std::move(r);
  return Status::OK();
}

CacheReader::Mapping CacheReader::mapping(int i) const {
  const LmdbEnv& env = *envs_[i]->env;
  return {env.path(), env.map(), manifest_.shards[i].bytes, env.fd()};
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

Status ReadTxn::Locate(uint64_t index, const uint8_t** value, uint64_t* size) {
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
    shard->cursor.MarkStale();
  }
  const ShardInfo& info = m.shards[si];
  MDB_val v;
  // Context strings are built only on failure: Locate allocates nothing
  // (a shard of packs opens its cursor once).
  const Status found =
      FindRecord(env, shard->txn.get(), info.KeyOf(index), info.packed(), &shard->cursor, &v);
  if (found.IsNotFound())
    return Status::Corruption(env.path() + ": record " + std::to_string(index) +
                              " missing from its shard");
  if (!found.ok()) return found.WithContext("record " + std::to_string(index));
  *value = static_cast<const uint8_t*>(v.mv_data);
  *size = v.mv_size;
  return Status::OK();
}

Status ReadTxn::Get(uint64_t index, RecordView* out, bool verify_checksum) {
  const uint8_t* value = nullptr;
  uint64_t size = 0;
  KILN_RETURN_IF_ERROR(Locate(index, &value, &size));
  return Check(index, value, size, nullptr, size, verify_checksum, out);
}

Status ReadTxn::Read(uint64_t index, uint8_t* header, void* payload, RecordView* out,
                     bool verify_checksum) {
  const uint8_t* value = nullptr;
  uint64_t size = 0;
  KILN_RETURN_IF_ERROR(Locate(index, &value, &size));
  const int si = reader_->manifest().ShardFor(index);
  const CacheReader::Mapping m = reader_->mapping(si);
  const bool v2 = reader_->manifest().format_version == kFormatVersion2;
  const uint64_t head = v2 ? reader_->image_offset_ : kRecordHeaderSize;
  const uint64_t want = v2 ? reader_->value_bytes_ : kRecordHeaderSize + reader_->record_bytes();
  // A value kiln cannot place in the file, or not of the manifest's size
  // (the mapped path's checks then say what is wrong with it), or of a
  // cache whose records vary in size.
  if (m.base == nullptr || m.fd < 0 || want == 0 || size != want)
    return Get(index, out, verify_checksum);
  uint64_t offset = static_cast<uint64_t>(value - m.base);
  const uint64_t image = reader_->record_bytes();
  struct iovec iov[3] = {{header, head}, {payload, image}, {header + head, size - head - image}};
  uint64_t left = size;
  while (left > 0) {
    const ssize_t got = preadv(m.fd, iov, 3, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return Status::Corruption(m.path + ": record " + std::to_string(index) + ": " +
                                (got < 0 ? std::string("read failed: ") + std::strerror(errno)
                                         : std::string("the file ends inside it (truncated)")));
    // A short read: go on after what arrived.
    uint64_t n = static_cast<uint64_t>(got);
    left -= n;
    offset += n;
    for (auto& v : iov) {
      const uint64_t take = std::min<uint64_t>(n, v.iov_len);
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + take;
      v.iov_len -= take;
      n -= take;
    }
  }
  // A table of another length than the manifest's would not lie within
  // `header`: the mapped path says what is wrong.
  if (v2 && (header[6] | (header[7] << 8)) != static_cast<int>(reader_->manifest().fields.size()))
    return Get(index, out, verify_checksum);
  return Check(index, header, head, payload, size, verify_checksum, out);
}

Status ReadTxn::Check(uint64_t index, const uint8_t* header, size_t head_len, const void* payload,
                      size_t value_size, bool verify_checksum, RecordView* out) {
  const Manifest& m = reader_->manifest();
  const int si = m.ShardFor(index);
  const std::string& path = reader_->shard_env(si).env->path();
  // The checksum is seeded with the record's key (its index, unless the
  // shard was linked from another cache).
  const uint64_t seed = m.shards[si].KeyOf(index);
  RecordHeader h;
  // The value in one piece (Get), or split around the image payload (Read).
  // Decoding reads the header and the field table only, which a split
  // value keeps in `header` (Read checked the field count).
  const bool whole = payload == nullptr;
  KILN_RETURN_IF_ERROR(DecodeRecordHeader(index, header, value_size, &h).WithContext(path));
  const uint8_t* mid = whole ? nullptr : static_cast<const uint8_t*>(payload);
  const size_t mid_len = whole ? 0 : reader_->record_bytes();
  const uint8_t* tail = whole ? nullptr : header + head_len;
  KILN_RETURN_IF_ERROR(
      ResolveRecord(m, index, header, whole ? value_size : head_len, mid, mid_len, tail, &h,
                    &m.shards[si])
          .WithContext(path));
  if (verify_checksum) {
    const Status sum =
        h.version == kRecordVersion2
            ? VerifyRecordChecksum(seed, header, mid, h, whole ? value_size : head_len, mid_len, tail)
            : VerifyRecordChecksum(seed, header, whole ? header + kRecordHeaderSize : payload, h);
    KILN_RETURN_IF_ERROR(NameLinkedRecord(sum, index, seed).WithContext(path));
  }
  // Where each field's bytes lie: in the one piece, or in the split.
  auto at = [&](uint64_t offset) -> const uint8_t* {
    if (whole) return header + offset;
    if (offset < head_len) return header + offset;
    if (offset < head_len + mid_len) return mid + (offset - head_len);
    return tail + (offset - head_len - mid_len);
  };
  out->num_fields = h.num_fields;
  for (int f = 0; f < h.num_fields; ++f) {
    const FieldEntry& e = h.fields[f];
    out->fields[f] = {at(e.offset), e.bytes, e.dtype, e.shape, e.codec};
  }
  // A shard linked from a cache with other class numbers: the label field
  // reads as the mapped label (ResolveRecord mapped h.label). A format 1
  // manifest's label field is its "label" (SetFormat1Fields).
  const int label = m.label_field;
  if (!m.shards[si].label_map.empty() && label >= 0 && h.label >= 0) {
    FieldView& f = out->fields[label];
    f.data = f.dtype == DType::kInt32
                 ? reinterpret_cast<const uint8_t*>(&reader_->class_values32_[h.label])
                 : reinterpret_cast<const uint8_t*>(&reader_->class_values64_[h.label]);
  }
  const int image = h.version == kRecordVersion2 ? m.image_field : 0;
  out->index = index;
  out->data = out->fields[image].data;
  out->codec = out->fields[image].codec;
  out->bytes = h.payload_bytes;
  out->dtype = h.dtype;
  out->shape = h.shape;
  out->label = h.label;
  out->checksum = h.checksum;
  return Status::OK();
}

}  // namespace kiln
