// Duplicate records and train/val overlap.
//
// A record's fingerprint is the XXH3-128 of its payload (the preprocessed
// tensor; a format 2 record's: every field but the label, with its shape -
// FingerprintRecord), so two records with equal fingerprints hold the same
// pixels: two
// source images that decode to the same pixels always do, whatever their
// names or encodings. kiln build reports the duplicates of what it wrote in
// OUT/duplicates.tsv; `kiln verify VAL --against TRAIN` compares two caches
// built separately (with the same recipe: the same dtype and shape).
#ifndef KILN_DUPLICATES_H_
#define KILN_DUPLICATES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cache_reader.h"
#include "kiln/status.h"

namespace kiln {

struct Fingerprint {
  uint64_t high = 0, low = 0;
  bool operator==(const Fingerprint& o) const { return high == o.high && low == o.low; }
  bool operator!=(const Fingerprint& o) const { return !(*this == o); }
  bool operator<(const Fingerprint& o) const {
    return high != o.high ? high < o.high : low < o.low;
  }
};

// XXH3-128 (xxHash 0.8, seed 0) of `bytes` bytes.
Fingerprint FingerprintBytes(const void* data, size_t bytes);

// A record's fingerprint in a cache of manifest `m`. Format 1: the
// payload's FingerprintBytes. Format 2: XXH3-128 (seed 0) over every field
// but the label field, in field order, each as its ndim and dims (u32
// little-endian each) followed by its bytes - so that two records are
// duplicates when all they hold besides their label is equal (an image
// with other boxes is another sample).
Fingerprint FingerprintRecord(const Manifest& m, const RecordView& v);

// One record's fingerprint and label.
struct RecordPrint {
  Fingerprint print;
  int64_t label = -1;
};

// The fingerprints of every record of an open cache, by index, computed on
// `threads` threads (0 = all cores). A record that cannot be read is a
// Corruption naming it (verify the cache first to see every problem). With
// `from` > 0, *out already holds the first `from` records' prints (kept
// from an earlier run): only the records after them are read.
Status FingerprintCache(const CacheReader& reader, int threads, std::vector<RecordPrint>* out,
                        uint64_t from = 0);

// One record among several caches: caches[cache], record index `record`.
struct DuplicateMember {
  size_t cache = 0;
  uint64_t record = 0;
  int64_t label = -1;
};

// Records that hold the same pixels; members sorted by (cache, record).
struct DuplicateGroup {
  Fingerprint print;
  std::vector<DuplicateMember> members;  // 2 or more
  // True when some members have different labels (the same image labelled twice differently).
  bool labels_differ() const;
  // True when the group has members in cache `a` and in cache `b`.
  bool spans(size_t a, size_t b) const;
};

// Every group of two or more records with equal fingerprints within and
// across `caches` (each a FingerprintCache result), ordered by their first
// member. None: an empty vector.
std::vector<DuplicateGroup> FindDuplicates(const std::vector<std::vector<RecordPrint>>& caches);

// Counts over FindDuplicates' groups.
struct DuplicateCounts {
  uint64_t groups = 0;          // groups of equal records
  uint64_t repeats = 0;         // records beyond the first of their group
  uint64_t label_conflicts = 0;  // groups whose members carry different labels
  // Records of cache `in` whose pixels are also in cache `of` (CountDuplicates's
  // arguments): for in = val, of = train, the validation images seen in training.
  uint64_t overlap = 0;
};
DuplicateCounts CountDuplicates(const std::vector<DuplicateGroup>& groups, size_t in = 1,
                                size_t of = 0);

// One line for a person: "duplicates: none", or "duplicates: 5 records repeat
// another (3 groups, 1 with different labels), 2 val records also in train
// (leakage: ...); see FILE".
std::string DuplicateSummary(const std::string& file, const DuplicateCounts& counts);

}  // namespace kiln

#endif  // KILN_DUPLICATES_H_
