// The files of a cache directory: the one owner of every name in it.
//
//   manifest.json          written last (temp file + rename): the cache is complete
//   shard-NNNNN.mdb        LMDB environments, one file each (LMDB adds NAME-lock)
//   sources.tsv            every source file and the record it became (kiln build)
//   rejects.tsv            inputs kiln build could not use, with the reason
//   duplicates.tsv         records with the same pixels as another (kiln build; in OUT)
//   build.json             the recipe of a build in progress (removed when it ends)
//   rejects.partial        rejects of a build in progress, by source position
//   .kiln.lock             flock(2) of the one writer
//   part-IIIII-of-NNNNN/   one part of a cache built in parts (kiln merge joins them)
//   train/ val/            the splits of a --val-fraction build
//
// docs/format.md describes each file.
#ifndef KILN_CACHE_LAYOUT_H_
#define KILN_CACHE_LAYOUT_H_

#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestTempName = "manifest.json.tmp";
// Shard i is the file "shard-%05d.mdb" (LMDB adds "shard-%05d.mdb-lock").
inline constexpr const char* kShardPrefix = "shard-";
inline constexpr const char* kShardSuffix = ".mdb";
inline constexpr const char* kLmdbLockSuffix = "-lock";
// A shard being rewritten in its canonical layout marks itself with this
// suffix until the rewrite is complete.
inline constexpr const char* kReplaySuffix = ".replay";
inline constexpr const char* kLockName = ".kiln.lock";
inline constexpr const char* kSourcesTsvName = "sources.tsv";
inline constexpr const char* kRejectsName = "rejects.tsv";
// In OUT of kiln build (the cache, or the parent of train/ and val/): the
// records that hold the same pixels as another, and train/val overlap.
inline constexpr const char* kDuplicatesTsvName = "duplicates.tsv";
inline constexpr const char* kBuildStateName = "build.json";
inline constexpr const char* kRejectLogName = "rejects.partial";
// While an append runs (and after one is interrupted): the record count
// the append started from, as {"count_before": N, "from": "..."}; the
// shards after the manifest's are that append's.
inline constexpr const char* kAppendMarkerName = "append.json";
// The fingerprints of a cache's shards that kiln build's duplicate report
// keeps (src/ingest/duplicate_report.cc), a folder in the cache.
inline constexpr const char* kFingerprintsDirName = ".fingerprints";
// Scratch directory of kiln merge for a part that needs new indices.
inline constexpr const char* kMergeScratchPrefix = ".merge-";

// The name of shard number `i` ("shard-00000.mdb").
std::string ShardFileName(int i);
// True for a name of the form shard-*.mdb (not its -lock file).
bool IsShardFile(const std::string& name);
// "part-00002-of-00008" (0-based index).
std::string PartDirName(int part, int num_parts);
// True for a name written by PartDirName.
bool IsPartDirName(const std::string& name);
// The split directories of a --val-fraction build, in order: "train", "val".
const std::vector<std::string>& SplitDirs();
// The cache that `path` and `split` name, for the commands that read one
// cache (kiln export, kiln preview): `path` itself when it is a cache (it
// holds a manifest or a build in progress, or is no directory) and `split`
// is empty; path/split when `path` is the parent of a --val-fraction
// build's splits (empty `split`: the first of SplitDirs()). Returns
// InvalidArgument for a split not in SplitDirs(), or one asked of a cache
// without splits, and NotFound when path/split is absent.
Status ResolveSplitDir(const std::string& path, const std::string& split, std::string* dir);

}  // namespace kiln

#endif  // KILN_CACHE_LAYOUT_H_
