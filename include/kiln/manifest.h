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
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string kiln_version;
  uint64_t count = 0;                 // total records, = sum of shard counts
  DType dtype = DType::kFloat16;      // of every record
  Shape shape;                        // of every record
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
  // One part of a cache built in parts (kiln build --num-parts N --part i):
  // its records are the global indices first_index .. first_index+count-1
  // of the whole cache. part_index < 0 for an ordinary cache (first_index 0).
  // Parts are verified on their own and joined by kiln merge; they are not
  // read for training.
  int part_index = -1;
  int part_count = 0;
  uint64_t first_index = 0;
  bool is_part() const { return part_index >= 0; }

  // Returns the shard holding `index`, or -1. O(log shards).
  int ShardFor(uint64_t index) const;
};

// Whether a record's header agrees with its manifest: the dtype and shape
// every record has, a label within the classes (when there are classes).
// Returns Corruption "record N: ..." saying what differs.
Status CheckRecordAgainstManifest(const Manifest& m, uint64_t index, const RecordHeader& h);

// What a reader does to a record's values to make a model's inputs. A
// uint8 cache stores pixels x: the input is (x / 255 - mean[c]) / std[c]
// for channel c, with the manifest's mean and std (*mean, *std get them).
// A float cache's values are inputs already: both stay empty. Returns
// Corruption naming DIR's manifest when a uint8 cache lacks a mean and a
// positive std for each of its channels (C of a CHW record, else 1).
Status InputNormalization(const Manifest& m, const std::string& dir, std::vector<double>* mean,
                          std::vector<double>* std);

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
