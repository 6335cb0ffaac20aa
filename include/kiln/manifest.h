// The manifest: what a cache holds and exactly how it was made.
//
// `manifest.json` is written last, through a temporary file and a rename, so
// a directory without it is an incomplete cache whatever its shards hold.
// docs/format.md describes every field.
#ifndef KILN_MANIFEST_H_
#define KILN_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cache_layout.h"
#include "kiln/preprocessing.h"
#include "kiln/record.h"
#include "kiln/status.h"

namespace kiln {

struct ShardInfo {
  std::string file;       // file name inside the cache directory
  uint64_t first = 0;     // global index of the shard's first record
  uint64_t count = 0;     // number of records; keys are first..first+count-1
  uint64_t bytes = 0;     // size of the shard file in bytes
  std::string digest;     // 16 hex digits: XXH3-64 over the record checksums in key order
  // A shard kiln merge --from linked from another cache unchanged keeps that
  // cache's keys: record first + j is stored under the key (and checksum
  // seed) key_first + j. Otherwise (keyed false) a record's key is its index.
  bool keyed = false;
  uint64_t key_first = 0;
  // A shard linked from a cache whose classes are numbered otherwise: its
  // records store that cache's labels, and label L means class
  // label_map[L] of this cache (readers give the mapped label; the
  // checksum covers the stored one). Empty: the stored label is the label.
  std::vector<int64_t> label_map;
  // LMDB entries in the shard when it holds packs of records (kiln/record.h,
  // the manifest's layout.pack_bytes); 0: one a record.
  uint64_t values = 0;
  bool packed() const { return values != 0 && values != count; }
  // Whether the shard was linked from another cache as it is (kiln merge
  // --from): it cannot be rewritten in place (--repair).
  bool linked() const { return keyed || !label_map.empty(); }
  // The LMDB key and checksum seed of record `index` of this shard.
  uint64_t KeyOf(uint64_t index) const { return keyed ? key_first + (index - first) : index; }
  // The record index of a key of this shard.
  uint64_t IndexOf(uint64_t key) const { return keyed ? first + (key - key_first) : key; }
};

// One field of a cache's records as the manifest declares it. A format 1
// cache has two: "image" (its sample dtype and shape) and "label" (int64,
// a scalar).
struct FieldSpec {
  std::string name;
  DType dtype = DType::kUint8;
  int ndim = 0;                          // 0: a scalar
  std::array<int64_t, kMaxDims> dims{};  // each >= 1, or kVariableDim
  // The largest size each dim took over the cache's records (= dims for a
  // fixed dim); written when the cache is finished.
  std::array<uint32_t, kMaxDims> max_dims{};
  // kJpeg: a record's payload of this field may be a JPEG (its entry's
  // codec; a record may also store it raw, as --encode auto does). The
  // manifest's "codec", absent for raw. Such a field is uint8 C x H x W.
  Codec codec = Codec::kRaw;
  static constexpr int64_t kVariableDim = -1;
  bool fixed() const;             // no variable dim
  Shape FixedShape() const;       // REQUIRES: fixed()
  std::string ShapeText() const;  // "3x?x?", "()" for a scalar
  // Whether a record's field of `dtype` and `shape` (stored as `codec`) is
  // one of this field's.
  bool Admits(DType dtype, const Shape& shape, Codec codec = Codec::kRaw) const;
};

// One append to a finished cache (CacheWriter's `append`): the records
// count_before .. count_after-1 were added, at `time` (UTC, ISO 8601), from
// `from` (what the writer was told: a source tree, a dataset's name).
struct AppendEntry {
  uint64_t count_before = 0;
  uint64_t count_after = 0;
  std::string time;
  std::string from;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string kiln_version;
  uint64_t count = 0;                 // total records, = sum of shard counts
  // The records' fields, in stored order (format 1: image and label).
  std::vector<FieldSpec> fields;
  // The field a loader makes model inputs of: the one named "image", else
  // the first; and the field of class indices (a scalar int32/int64 field,
  // named by the manifest's "label_field"; format 1: "label"), or -1.
  int image_field = 0;
  int label_field = -1;
  // The image field's dtype and shape (shape.ndim 0 when it varies from
  // record to record).
  DType dtype = DType::kFloat16;
  Shape shape;
  std::vector<std::string> classes;   // label i names classes[i]; may be empty
  std::vector<ShardInfo> shards;      // in index order, contiguous
  // The recipe that produced the tensors (incomplete, "{}", when the
  // writer recorded none).
  Preprocessing preprocessing;
  // How the writer batched its LMDB writes (the "layout" object): a shard's
  // bytes are a function of its records and these two, which lets a repair
  // rewrite a shard exactly as a fresh build writes it. 0 = not recorded.
  uint64_t initial_map_size = 0;
  uint64_t commit_records = 0;
  // Format 2 instead of commit_records: a commit after the record that
  // takes the batch's value bytes to commit_bytes.
  uint64_t commit_bytes = 0;
  // Format 2: records are stored in packs (kiln/record.h), each closed
  // after the record that takes it to pack_bytes or at its commit's end;
  // 0: a value a record. A cache with packs is format 3.
  uint64_t pack_bytes = 0;
  // One part of a cache built in parts (kiln build --num-parts N --part i):
  // its records are the global indices first_index .. first_index+count-1
  // of the whole cache. part_index < 0 for an ordinary cache (first_index 0).
  // Parts are verified on their own and joined by kiln merge; they are not
  // read for training.
  int part_index = -1;
  int part_count = 0;
  uint64_t first_index = 0;
  // The appends that grew the cache, oldest first (empty for a cache
  // written in one go); the manifest's "appends".
  std::vector<AppendEntry> appends;
  bool is_part() const { return part_index >= 0; }

  // Returns the shard holding `index`, or -1. O(log shards).
  int ShardFor(uint64_t index) const;
};

// Whether a version 1 record's header agrees with its manifest: the dtype
// and shape every record has, a label within the classes (when there are
// classes). Returns Corruption "record N: ..." saying what differs.
Status CheckRecordAgainstManifest(const Manifest& m, uint64_t index, const RecordHeader& h);

// Checks a decoded record of either version against its manifest and
// points `h`'s dtype, shape and payload_bytes at the image field and its
// label at the label field's value (-1 without one). The value lies in up
// to three pieces, as VerifyRecordChecksum takes them: `head` (its first
// `head_len` bytes), `mid` (the next `mid_len`) and `tail` (the rest);
// for a value in one piece pass head = value, head_len = its size. A
// version 1 record needs only the header in `head`. Version 2: its record
// version must be the manifest's, its fields the manifest's in number,
// dtype, ndim and fixed sizes, and a label within the classes. Returns
// Corruption "record N: ..." saying what differs.
// `shard` is the record's shard (its label_map applies; nullptr: none).
Status ResolveRecord(const Manifest& m, uint64_t index, const uint8_t* head, size_t head_len,
                     const uint8_t* mid, size_t mid_len, const uint8_t* tail, RecordHeader* h,
                     const ShardInfo* shard);

// What a reader does to a record's values to make a model's inputs. A
// uint8 cache stores pixels x: the input is (x / 255 - mean[c]) / std[c]
// for channel c, with the manifest's mean and std (*mean, *std get them).
// A float cache's values are inputs already: both stay empty. Returns
// Corruption naming DIR's manifest when a uint8 cache lacks a mean and a
// positive std for each of its channels (C of a CHW record, else 1).
Status InputNormalization(const Manifest& m, const std::string& dir, std::vector<double>* mean,
                          std::vector<double>* std);

// The fields kiln reads as annotations of the image field (C x H x W), by
// name and type: the loader moves them with its crops, preview and export
// draw them, kiln build --masks writes a mask.
//  - "mask": class indices per pixel, an integer field (uint8, int32,
//    int64) of H x W, or K x H x W with K fixed, with the image's H and W
//    (the same fixed sizes, or varying where the image's do);
//  - "boxes": float32 N x 4, each row x1, y1, x2, y2 in the image's pixels.
inline constexpr char kMaskFieldName[] = "mask";
inline constexpr char kBoxesFieldName[] = "boxes";
bool IsMaskField(const FieldSpec& f, const FieldSpec& image);
bool IsBoxesField(const FieldSpec& f);

// Whether the n fields of record `index` fit the declared `specs` (and,
// with `within_max`, the largest sizes the specs record): InvalidArgument
// naming the record and the field otherwise.
Status CheckFieldsFit(const std::vector<FieldSpec>& specs, uint64_t index, const FieldData* fields,
                      int n, bool within_max = false);

// Sets a format 1 manifest's fields from its dtype and shape: "image" and
// "label" (int64 scalar), image_field 0, label_field 1.
void SetFormat1Fields(Manifest* m);

// Checks a format 2 cache's declared fields: 1..kMaxFields of them, names
// unique and not empty, at most kMaxDims dims each, fixed sizes >= 1 and
// bounded as a record's; `label_field` (empty for none) one of them, an
// int64 or int32 scalar. Sets *image_field (the one named "image", else 0)
// and *label_index (-1 without a label field). Returns InvalidArgument
// naming `where` and the field.
Status CheckFieldSpecs(const std::vector<FieldSpec>& fields, const std::string& label_field,
                       const std::string& where, int* image_field, int* label_index);

// Serializes to pretty-printed JSON text.
std::string ManifestToJson(const Manifest& m);
// Parses and checks structure: format version, dtype, shape, shards
// contiguous from first_index (0 unless a part) and summing to count.
// Returns Corruption naming `where`.
Status ManifestFromJson(const std::string& text, const std::string& where, Manifest* out);

// Reads DIR/manifest.json. Returns NotFound when DIR does not exist,
// Incomplete when DIR exists without a manifest (the build did not finish).
Status ReadManifest(const std::string& dir, Manifest* out);
// Writes DIR/manifest.json atomically (temp file, fsync, rename, fsync dir).
Status WriteManifest(const std::string& dir, const Manifest& m);

// Hex form of a 64-bit digest (16 lowercase digits).
std::string DigestHex(uint64_t digest);

// What differs between two caches in the things that shape the tensors a
// model sees: record dtype and shape, then TensorRecipeDifferences. Each
// entry is a phrase such as "mean: [0.286] vs [0.5]"; empty when they agree.
// Source, split and version fields are not compared.
std::vector<std::string> PreprocessingDifferences(const Manifest& a, const Manifest& b);

// This build of kiln's version string.
const char* KilnVersion();

}  // namespace kiln

#endif  // KILN_MANIFEST_H_
