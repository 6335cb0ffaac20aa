// CacheReader: random access to the records of a finished cache.
//
// Open() reads manifest.json and opens every shard read-only
// (MDB_RDONLY|MDB_NOTLS|MDB_NORDAHEAD; without a lock file on a read-only
// filesystem). Records are read through a ReadTxn, which hands out views
// that point straight into the shard's memory map: no copy is made.
//
// Thread-safety: a CacheReader is immutable after Open and may be shared by
// any number of threads. A ReadTxn belongs to one thread at a time; give
// each thread its own.
#ifndef KILN_CACHE_READER_H_
#define KILN_CACHE_READER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/manifest.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln {

struct ReaderOptions {
  unsigned max_readers = 512;  // concurrent ReadTxns per shard
  // Open one part of a cache built in parts (records first_index.. by
  // global index), for kiln merge; refused otherwise (NotSupported).
  bool allow_part = false;
};

// One field of a record as stored.
struct FieldView {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;  // the payload's length (a JPEG's, when encoded)
  DType dtype = DType::kUint8;
  Shape shape;  // ndim 0 for a scalar; an encoded image's decoded C x H x W
  Codec codec = Codec::kRaw;  // kJpeg: `data` is a JPEG (DecodeField decodes it)
};

// One record as stored. `data` points into the memory map and stays valid
// only until the ReadTxn that produced it is reset or destroyed.
struct RecordView {
  uint64_t index = 0;
  // The image field (the manifest's image_field; format 1: the payload).
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kUint8;
  Shape shape;
  Codec codec = Codec::kRaw;  // the image field's: kJpeg when `data` is a JPEG
  int64_t label = -1;     // the label field's value; -1 without one
  uint64_t checksum = 0;  // as stored
  // Every field, in the manifest's order (format 1: "image", the payload,
  // and "label", the header's int64).
  int num_fields = 0;
  std::array<FieldView, kMaxFields> fields{};
};

class CacheReader;

// A read snapshot over all shards of one cache. Transactions are begun
// lazily per shard on first access.
class ReadTxn {
 public:
  ~ReadTxn();
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;

  // Looks up record `index`, checks its header against the manifest (dtype,
  // shape, label within the classes) and, if `verify_checksum`, its
  // checksum. Returns NotFound for an index past the end, Corruption naming
  // the shard and index otherwise. `out` is valid until Reset().
  Status Get(uint64_t index, RecordView* out, bool verify_checksum = false);

  // Record `index` read with pread(2) instead of through the memory map:
  // its image field's payload into `payload` (the manifest's
  // record_bytes()) and its other bytes (header, other fields) into
  // `header` (the reader's read_header_bytes()), with Get's checks. For a
  // cache that is not in memory: a copy from the map would fault in each
  // page of it (slow where page faults are, as in virtual machines), a read
  // takes them straight from the page cache, and a truncated file is an
  // error, never a SIGBUS. `out->data` points to `payload` - or, for a
  // record kiln cannot place in the file, into the map as Get's: copy from
  // out->data.
  Status Read(uint64_t index, uint8_t* header, void* payload, RecordView* out,
              bool verify_checksum = false);

  // Where record `index`'s stored value (header and payload) lies in its
  // shard's memory map, without reading a byte of it and without any
  // check: for read-ahead, which asks the disk for those bytes before they
  // are read (only the LMDB tree pages leading to it are touched). The
  // pointer is valid until Reset(). Returns what Get returns for a
  // missing record.
  Status Locate(uint64_t index, const uint8_t** value, uint64_t* size);

  // Releases the snapshots (invalidating every view) but keeps the handles
  // for cheap reuse by the next Get.
  void Reset();

 private:
  friend class CacheReader;
  explicit ReadTxn(const CacheReader* reader);
  // Get's checks of a stored value, held in `header` (its first
  // `head_len` bytes, and after them the bytes past the image payload, as
  // Read leaves them) and `payload` (the image field's payload; for a
  // value in one piece, header + head_len).
  Status Check(uint64_t index, const uint8_t* header, size_t head_len, const void* payload,
               size_t value_size, bool verify_checksum, RecordView* out);
  struct Shard;
  const CacheReader* reader_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

class CacheReader {
 public:
  // Opens the cache in DIR. Returns NotFound if DIR does not exist,
  // Incomplete when the build has not finished (no manifest), Corruption for a bad manifest, a
  // missing shard, a shard whose size differs from the manifest (truncated
  // or grown) or whose record count differs.
  static Status Open(const std::string& dir, const ReaderOptions& options,
                     std::unique_ptr<CacheReader>* out);
  ~CacheReader();

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  uint64_t size() const { return manifest_.count; }
  // The bytes of a record's image field (0 when its size varies, or when
  // it may be encoded).
  uint64_t record_bytes() const {
    return manifest_.fields.empty() || manifest_.fields[manifest_.image_field].codec == Codec::kRaw
               ? manifest_.shape.NumElements() * DTypeSize(manifest_.dtype)
               : 0;
  }
  // What ReadTxn::Read's `header` buffer must hold: a record's bytes other
  // than its image payload (kRecordHeaderSize for format 1).
  uint64_t read_header_bytes() const { return read_header_bytes_; }

  // A new transaction for the calling thread.
  std::unique_ptr<ReadTxn> BeginRead() const;

  // Shard `i` as this process maps it (read-only, shared with any other
  // reader of the file in the process): for page-cache residency checks,
  // read-ahead and eviction. The map may extend past the file's end.
  struct Mapping {
    std::string path;
    const uint8_t* base = nullptr;
    uint64_t file_bytes = 0;  // the shard's size
    int fd = -1;              // LMDB's descriptor of the file (for pread; do not close)
  };
  Mapping mapping(int i) const;

 private:
  // One open shard (internal, cache_reader.cc); ReadTxn reads through it.
  class ShardEnv;
  friend class ReadTxn;
  const ShardEnv& shard_env(int i) const { return *envs_[i]; }

  CacheReader() = default;
  std::string dir_;
  Manifest manifest_;
  // Format 2 with fixed fields: each value's length and where the image
  // payload starts in it (0 when a field's size varies: Read maps).
  uint64_t value_bytes_ = 0;
  uint64_t image_offset_ = 0;
  uint64_t read_header_bytes_ = kRecordHeaderSize;
  std::vector<std::unique_ptr<ShardEnv>> envs_;
  // 0, 1, ... one per class, as the label field's dtype: where a record of
  // a shard with a label_map gets its label field's (mapped) bytes.
  std::vector<int64_t> class_values64_;
  std::vector<int32_t> class_values32_;
};

// The pixels of a stored image field as a C x H x W uint8 tensor (or, for
// a raw field, its bytes) into `out` (replaced): a JPEG decoded whole, at
// scale 1, checked against the entry's shape. Corruption naming `what`
// (e.g. "DIR: record 7, field 'image'") for a JPEG that does not decode or
// whose size or channels differ from the entry's. Allocates a decoder per
// call: for one record at a time (export, the Python Cache, verify).
Status DecodeField(const FieldView& v, const std::string& what, std::vector<uint8_t>* out);

}  // namespace kiln

#endif  // KILN_CACHE_READER_H_
