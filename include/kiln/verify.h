// VerifyCache: proves that a cache is intact and complete.
//
// Levels (each includes the ones before):
//   quick - manifest parses and has this kiln's format version; every shard
//           listed is present with the recorded size and record count; no
//           unexpected shard file; keys contiguous; every header sane (magic,
//           version, dtype, payload length = shape x dtype size, label within
//           the classes).
//   full  - every record's checksum recomputed (in parallel, straight from
//           the memory map), per-shard digests compared with the manifest,
//           float payloads free of NaN and Inf.
// The source-file checks (kiln verify --level sources|deep) need the
// sources and live in kiln::ingest (VerifyWithSources), on top of this report.
//
// Thread-safety: VerifyCache may run concurrently on different caches.
#ifndef KILN_VERIFY_H_
#define KILN_VERIFY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/progress.h"
#include "kiln/status.h"

namespace kiln {

enum class VerifyLevel { kQuick = 0, kFull = 1 };
const char* VerifyLevelName(VerifyLevel level);
Status ParseVerifyLevel(const std::string& name, VerifyLevel* out);

struct VerifyOptions {
  VerifyLevel level = VerifyLevel::kFull;
  int threads = 0;  // worker threads for the checksum pass; 0 = all cores
  // Called from the calling thread after every block of records (and once
  // with final = true): records checked of the manifest's count, payload
  // bytes checksummed. May print. Empty = no progress.
  std::function<void(const Progress&)> progress;
  // Bytes of records checksummed at a time, while the next block's headers
  // are read; 0 = 64 MB. Smaller only to test the hand-over between blocks.
  uint64_t block_bytes = 0;
};

// One thing found wrong. `index` is -1 when the problem is not one record's.
struct VerifyProblem {
  // What kind of damage, for callers that act on it (kiln build --repair)
  // instead of reading `what`.
  enum class Kind {
    kRecord,         // one record is bad or missing: rewritable from its source
    kShardMismatch,  // a shard's size (grown), record count or digest differs from the
                     // manifest: follows from damaged or missing records
    kShardFile,      // a shard is missing, truncated, unreadable or not listed
    kRecordLost,     // a record lies outside its shard's range
    kManifest,       // the manifest is missing, unreadable or inconsistent
    kSource,         // the sources differ from the build's, or cannot be compared
  };
  int64_t index = -1;
  std::string shard;   // shard file name, "" when not known
  std::string source;  // source file of the record, when known
  std::string what;    // a sentence saying what is wrong
  Kind kind = Kind::kRecord;
};

struct VerifyReport {
  // The level that made the report, by name: core's "quick" or "full", or
  // a check above core ("sources", "deep").
  std::string level = "full";
  uint64_t records_checked = 0;
  uint64_t bytes_checked = 0;    // payload + header bytes whose checksums were recomputed
  uint64_t shard_bytes = 0;      // size of all shard files
  double seconds = 0;
  std::vector<VerifyProblem> problems;
  // What is not damage but worth saying: shard files after the manifest's
  // (an append in progress, or an interrupted one, which readers ignore).
  std::vector<std::string> notes;
  bool clean() const { return problems.empty(); }
};

// Verifies the cache in DIR at options.level. Damage goes into `report`: the Status is OK
// whenever the check itself could run. Returns NotFound when DIR does not
// exist and IOError when it cannot be read.
Status VerifyCache(const std::string& dir, const VerifyOptions& options, VerifyReport* report);

// The report as one JSON document (problems in index order).
std::string VerifyReportToJson(const std::string& dir, const VerifyReport& report);

}  // namespace kiln

#endif  // KILN_VERIFY_H_
