#include "kiln/verify.h"

#include <dirent.h>
#include <sys/stat.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/encoded_image.h"
#include "core/file.h"
#include "core/lmdb_check.h"
#include "core/lmdb_env.h"
#include "core/page_cache.h"
#include "core/shard_digest.h"
#include "kiln/cache_reader.h"
#include "kiln/manifest.h"

namespace kiln {

const char* VerifyLevelName(VerifyLevel level) {
  switch (level) {
    case VerifyLevel::kQuick:
      return "quick";
    case VerifyLevel::kFull:
      return "full";
  }
  return "?";
}

Status ParseVerifyLevel(const std::string& name, VerifyLevel* out) {
  for (VerifyLevel l : {VerifyLevel::kQuick, VerifyLevel::kFull}) {
    if (name == VerifyLevelName(l)) {
      *out = l;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown verify level '" + name + "' (expected quick or full)");
}

namespace {

// Whether a float payload holds NaN or Inf: all exponent bits set. Written
// without an early exit inside a block, so that the compiler vectorizes it;
// on x86-64 compiled twice (SSE2, AVX2) and picked at run time: after the
// checksum this scan is verify's largest cost. (A test of the CPU, not
// target_clones: an ifunc resolver runs before a sanitizer's runtime is
// up, and crashed every sanitized test binary.)
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_AVX2_DISPATCH 1
#define KILN_INLINE_ALWAYS __attribute__((always_inline)) inline  // compiled into each caller
#else
#define KILN_AVX2_DISPATCH 0
#define KILN_INLINE_ALWAYS inline
#endif

template <typename T, T kMask>
KILN_INLINE_ALWAYS bool AnyAllOnes(const uint8_t* p, uint64_t n) {
  // (x & kMask) == kMask exactly where (~x & kMask) is 0: a block holds
  // NaN or Inf when the least of those is 0 (a min per lane, no branch).
  constexpr uint64_t kBlock = 2048;
  for (uint64_t i = 0; i < n; i += kBlock) {
    const uint64_t m = std::min(kBlock, n - i);
    const uint8_t* q = p + i * sizeof(T);
    T least = kMask;
    for (uint64_t j = 0; j < m; ++j) {
      T x;
      std::memcpy(&x, q + j * sizeof(T), sizeof(T));
      const T e = static_cast<T>(~x & kMask);
      least = e < least ? e : least;
    }
    if (least == 0) return true;
  }
  return false;
}

#if KILN_AVX2_DISPATCH
template <typename T, T kMask>
__attribute__((target("avx2"))) bool AnyAllOnesAvx2(const uint8_t* p, uint64_t n) {
  return AnyAllOnes<T, kMask>(p, n);
}
#endif

template <typename T, T kMask>
bool AnyAllOnesBest(const uint8_t* p, uint64_t n) {
#if KILN_AVX2_DISPATCH
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return AnyAllOnesAvx2<T, kMask>(p, n);
#endif
  return AnyAllOnes<T, kMask>(p, n);
}

bool HasNonFinite(DType dtype, const uint8_t* p, uint64_t bytes) {
  if (dtype == DType::kFloat16) return AnyAllOnesBest<uint16_t, 0x7C00u>(p, bytes / 2);
  if (dtype == DType::kFloat32) return AnyAllOnesBest<uint32_t, 0x7F800000u>(p, bytes / 4);
  return false;
}

struct Slot {
  uint64_t index;
  uint64_t seed;      // its key, which seeds the checksum (ShardInfo::KeyOf)
  const uint8_t* value;
  size_t size;
  uint64_t checksum;  // as stored
};

class Verifier {
 public:
  Verifier(std::string dir, const VerifyOptions& o, VerifyReport* r)
      : dir_(std::move(dir)), opt_(o), rep_(r) {}

  using Kind = VerifyProblem::Kind;
  void Problem(Kind kind, int64_t index, const std::string& shard, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    rep_->problems.push_back({index, shard, "", what, kind});
  }

  void Run() {
    Status s = ReadManifest(dir_, &m_);
    if (!s.ok()) {
      Problem(Kind::kManifest, -1, "", s.message());
      return;
    }
    CheckUnexpectedFiles();
    for (const ShardInfo& info : m_.shards) CheckShard(info);
  }

 private:
  // Whether an append from the manifest's count is running or was
  // interrupted (its marker names that count).
  bool AppendPending() const {
    std::ifstream in(dir_ + "/" + kAppendMarkerName);
    if (!in) return false;
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    return j.is_object() && j.contains("count_before") && j["count_before"].is_number_unsigned() &&
           j["count_before"].get<uint64_t>() == m_.count;
  }

  void CheckUnexpectedFiles() {
    std::set<std::string> listed;
    for (const ShardInfo& s : m_.shards) listed.insert(s.file);
    // The shards an append writes after the manifest's, until it publishes
    // the new manifest (CacheWriter's `append`).
    std::set<std::string> appending;
    for (int k = static_cast<int>(m_.shards.size()); AppendPending(); ++k) {
      struct stat st;
      const std::string name = ShardFileName(k);
      if (listed.count(name) || ::stat((dir_ + "/" + name).c_str(), &st) != 0) break;
      appending.insert(name);
    }
    if (!appending.empty())
      rep_->notes.push_back(
          std::to_string(appending.size()) + " shard file(s) from " + *appending.begin() +
          " on are not in the manifest: an append in progress, or an interrupted one (the " +
          std::to_string(m_.count) +
          " records the manifest lists are what readers see); run the same append again to "
          "finish it, or remove those files");
    DIR* d = opendir(dir_.c_str());
    if (!d) return;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (IsShardFile(name) && !listed.count(name) && !appending.count(name))
        Problem(Kind::kShardFile, -1, name,
                "unexpected shard file not listed in the manifest (left from another "
                "build, or the manifest was edited)");
    }
    closedir(d);
  }

  void CheckShard(const ShardInfo& info) {
    const std::string path = dir_ + "/" + info.file;
    uint64_t size = 0;
    Status s = FileSize(path, &size);
    if (!s.ok()) {
      Problem(Kind::kShardFile, static_cast<int64_t>(info.first), info.file,
              "shard file missing: records " + std::to_string(info.first) + ".." +
                  std::to_string(info.first + info.count - 1) + " are lost");
      return;
    }
    rep_->shard_bytes += size;
    if (size != info.bytes) {
      Problem(size < info.bytes ? Kind::kShardFile : Kind::kShardMismatch, -1, info.file,
              "shard is " + std::to_string(size) + " bytes, manifest says " +
                  std::to_string(info.bytes) +
                  (size < info.bytes ? " (truncated)" : " (modified)"));
      if (size < info.bytes) return;  // reading a truncated map could fault
    }
    // LMDB trusts its pages: a damaged one would crash this process, so the
    // file's structure is proven first (core/lmdb_check.h). The headers of
    // the overflow values' first pages, which LMDB does not read, are checked
    // below where the pass reaches each value: a walk that read them would
    // cost a random read per record of a cold shard.
    LmdbFileSummary structure;
    s = CheckLmdbFile(path, size, &structure);
    if (!s.ok()) {
      Problem(Kind::kShardFile, -1, info.file,
              s.message() + "; its records" +
                  (info.count ? " " + std::to_string(info.first) + ".." +
                                    std::to_string(info.first + info.count - 1)
                              : std::string()) +
                  " cannot be read safely");
      return;
    }
    std::shared_ptr<const LmdbEnv> shared;  // shared with a reader of the file in this process
    s = OpenSharedForRead(path, 16, &shared);
    if (!s.ok()) {
      Problem(Kind::kShardFile, -1, info.file, "cannot open shard: " + s.message());
      return;
    }
    const LmdbEnv& env = *shared;
    LmdbTxn txn;
    s = txn.Begin(env, true);
    if (!s.ok()) {
      Problem(Kind::kShardFile, -1, info.file, s.message());
      return;
    }
    // One pass in key order, which is file order: headers as the cursor
    // reaches them, checksums a block (64 MB) at a time in parallel, the
    // next bytes read ahead - a cold shard is read once, sequentially,
    // also when it is larger than memory.
    const bool full = opt_.level >= VerifyLevel::kFull;
    shard_done_ = 0;
    SequentialReadAhead ahead;
    const uint8_t* const map_end = env.map() != nullptr ? env.map() + size : nullptr;
    std::vector<Slot> block;
    uint64_t block_bytes = 0;
    const uint64_t block_limit = opt_.block_bytes ? opt_.block_bytes : kBlockBytes;
    // A block's checksums run on the arena's threads while this one walks
    // the next block (its headers, its page faults, the read-ahead advice):
    // the walk is serial, and waiting for it left the checksum threads idle.
    // Its counts and the progress callback stay on this thread.
    std::vector<Slot> checking_slots;
    std::thread checking;
    auto settle = [&] {
      if (!checking.joinable()) return;
      checking.join();
      CountChecked(checking_slots);
      checking_slots.clear();
    };
    auto check_async = [&](std::vector<Slot> slots) {
      settle();
      checking_slots = std::move(slots);
      checking = std::thread([this, &info, &checking_slots] { CheckPayloads(info, checking_slots); });
    };
    // The stored checksums in key order, for the shard's digest; reserved
    // for the records the shard holds (the structure walk counted them), not
    // for the manifest's count, which may claim 2^40 of them.
    std::vector<uint64_t> checksums;
    checksums.reserve(std::min(structure.entries, info.count));
    uint64_t expect = info.first;
    const uint64_t end = info.first + info.count;
    uint64_t found = 0, values = 0;
    s = ForEachRecordIn(env, txn, [&](const MDB_val& k, const MDB_val& v, const MDB_val& stored,
                                      bool first_of_stored) {
      ++found;
      if (k.mv_size != kKeySize) {
        Problem(Kind::kShardFile, -1, info.file,
                "a key of " + std::to_string(k.mv_size) + " bytes (not a kiln key)");
        return true;
      }
      // A linked shard's keys are its records' keys in the cache it came
      // from (ShardInfo::keyed); its record indices follow from them.
      const uint64_t key = DecodeKey(static_cast<const uint8_t*>(k.mv_data));
      const uint64_t key_lo = info.KeyOf(info.first);
      if (key < key_lo || key - key_lo >= info.count) {
        Problem(Kind::kRecordLost, static_cast<int64_t>(key), info.file,
                (info.keyed ? "key outside the shard's keys " + std::to_string(key_lo) + ".." +
                                  std::to_string(key_lo + info.count - 1)
                            : "record outside the shard's range " + std::to_string(info.first) +
                                  ".." + std::to_string(end - 1)));
        return true;
      }
      const uint64_t idx = info.IndexOf(key);
      Missing(info, expect, idx);
      expect = idx + 1;
      const uint8_t* value = static_cast<const uint8_t*>(v.mv_data);
      if (full) ahead.Reached(value, map_end);
      if (first_of_stored)  // a pack's page header once, where its first record is
        CheckOverflowHeader(info, path, env, structure.page_size, idx,
                            static_cast<const uint8_t*>(stored.mv_data), stored.mv_size);
      const size_t before = block.size();
      CheckHeader(info, idx, value, v.mv_size, &block);
      if (block.size() > before) {
        checksums.push_back(block.back().checksum);
        block_bytes += v.mv_size;
      }
      if (!full) block.clear();
      if (block_bytes >= block_limit) {
        check_async(std::move(block));
        block.clear();
        block_bytes = 0;
      }
      return true;
    }, &values);
    settle();
    if (full) {
      CheckPayloads(info, block);
      CountChecked(block);
    }
    if (!s.ok()) Problem(Kind::kShardFile, -1, info.file, "cannot read shard: " + s.message());
    Missing(info, expect, end);
    if (found != info.count)
      Problem(Kind::kShardMismatch, -1, info.file,
              "shard holds " + std::to_string(found) + " records, manifest says " +
                  std::to_string(info.count));
    if (s.ok() && info.values != 0 && values != info.values)
      Problem(Kind::kShardMismatch, -1, info.file,
              "shard holds " + std::to_string(values) + " values (packs of records), manifest "
              "says " + std::to_string(info.values));
    rep_->records_checked += found;
    if (full) {
      ShardDigest digest;
      for (uint64_t c : checksums) digest.Add(c);
      // A shard with missing or damaged records already has problems; the
      // digest tells about records replaced by other valid ones.
      if (checksums.size() == info.count && digest.Hex() != info.digest)
        Problem(Kind::kShardMismatch, -1, info.file,
                "shard digest differs from the manifest (records replaced, or the "
                "manifest edited)");
    }
    progress_done_ += info.count;
    Report(progress_done_, false);
  }

 public:
  void Report(uint64_t done, bool final) {
    if (!opt_.progress) return;
    Progress p;
    p.done = std::min(done, m_.count);
    p.total = m_.count;
    p.bytes = rep_->bytes_checked;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    p.final = final;
    opt_.progress(p);
  }

 private:
  // Reports records from .. to-1 missing: each on its own, or a longer run
  // as one problem naming the range, so that a manifest claiming 2^40
  // records of a small shard gives one problem, not 2^40.
  void Missing(const ShardInfo& info, uint64_t from, uint64_t to) {
    constexpr uint64_t kListedOneByOne = 1000;
    if (to <= from) return;
    if (to - from <= kListedOneByOne) {
      for (uint64_t i = from; i < to; ++i)
        Problem(Kind::kRecord, static_cast<int64_t>(i), info.file, "record missing");
      return;
    }
    Problem(Kind::kRecord, static_cast<int64_t>(from), info.file,
            "records " + std::to_string(from) + ".." + std::to_string(to - 1) + " missing (" +
                std::to_string(to - from) + " records)");
  }

  void CheckHeader(const ShardInfo& info, uint64_t idx, const uint8_t* value, size_t size,
                   std::vector<Slot>* slots) {
    RecordHeader h;
    Status s = DecodeRecordHeader(idx, value, size, &h);
    if (!s.ok()) {
      Problem(Kind::kRecord, static_cast<int64_t>(idx), info.file, s.message());
      return;
    }
    const RecordHeader decoded = h;
    s = ResolveRecord(m_, idx, value, size, nullptr, 0, nullptr, &h, &info);
    if (!s.ok()) {
      Problem(Kind::kRecord, static_cast<int64_t>(idx), info.file, s.message());
      // A record of another shape is not checksummed: its payload length
      // is not the manifest's. (A version 2 record's table bounds its
      // payloads by the value's length: its checksum is still checked.)
      if (decoded.version == kRecordVersion && (h.dtype != m_.dtype || h.shape != m_.shape)) return;
    }
    slots->push_back({idx, info.KeyOf(idx), value, size, h.checksum});
  }

  // An overflow value (one that starts 16 bytes into a page: a value inside
  // a leaf page never does) must sit behind its overflow page's header. The
  // page is being read for the value anyway.
  void CheckOverflowHeader(const ShardInfo& info, const std::string& path, const LmdbEnv& env,
                           uint64_t page_size, uint64_t idx, const uint8_t* value, size_t size) {
    if (env.map() == nullptr || page_size == 0 || value < env.map() + 16) return;
    const uint64_t offset = static_cast<uint64_t>(value - env.map()) - 16;
    if (offset % page_size != 0) return;
    const std::string wrong =
        OverflowHeaderProblem(value - 16, offset / page_size, size, page_size);
    if (!wrong.empty())
      Problem(Kind::kShardFile, static_cast<int64_t>(idx), info.file,
              path + ": LMDB structure damaged: page " + std::to_string(offset / page_size) + ": " +
                  wrong + " (record " + std::to_string(idx) + "'s value)");
  }

  // Checksums (and NaN/Inf) of a block of records, in parallel.
  void CheckPayloads(const ShardInfo& info, const std::vector<Slot>& slots) {
    if (slots.empty()) return;
    auto work = [&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, slots.size(), 16),
                        [&](const tbb::blocked_range<size_t>& r) {
                          for (size_t i = r.begin(); i != r.end(); ++i)
                            CheckPayload(info, slots[i]);
                        });
    };
    if (opt_.threads > 0) {
      if (!arena_) arena_ = std::make_unique<tbb::task_arena>(opt_.threads);
      arena_->execute(work);
    } else {
      work();
    }
  }

  // On the calling thread, once a block is checked.
  void CountChecked(const std::vector<Slot>& slots) {
    if (slots.empty()) return;
    for (const Slot& s : slots) rep_->bytes_checked += s.size;
    shard_done_ += slots.size();
    Report(progress_done_ + shard_done_, false);
  }

  void CheckPayload(const ShardInfo& info, const Slot& s) {
    RecordHeader h;
    if (!DecodeRecordHeader(s.index, s.value, s.size, &h).ok()) return;
    Status st = NameLinkedRecord(VerifyRecordChecksum(s.seed, s.value, h), s.index, s.seed);
    if (!st.ok()) {
      Problem(Kind::kRecord, static_cast<int64_t>(s.index), info.file, st.message());
      return;
    }
    for (int f = 0; f < h.num_fields; ++f) {
      const FieldEntry& e = h.fields[f];
      if (e.codec != Codec::kRaw) {
        // The checksum proves the bytes are those written; decoding proves
        // they were a JPEG of the entry's image (each thread its decoder).
        thread_local internal::Decoder decoder;
        thread_local internal::JpegRegion region;
        const Status st = decoder.Decode(
            s.value + e.offset, e.bytes, static_cast<int>(e.shape.dims[2]),
            static_cast<int>(e.shape.dims[1]), static_cast<int>(e.shape.dims[0]), 1, 0, 0, 0, 0,
            &region);
        if (!st.ok()) {
          Problem(Kind::kRecord, static_cast<int64_t>(s.index), info.file,
                  "field '" +
                      (f < static_cast<int>(m_.fields.size()) ? m_.fields[f].name
                                                              : std::to_string(f)) +
                      "': " + st.message());
          break;
        }
        continue;
      }
      if (HasNonFinite(e.dtype, s.value + e.offset, e.bytes)) {
        Problem(Kind::kRecord, static_cast<int64_t>(s.index), info.file,
                h.version == kRecordVersion
                    ? std::string("payload holds NaN or Inf")
                    : "field '" +
                          (f < static_cast<int>(m_.fields.size()) ? m_.fields[f].name
                                                                  : std::to_string(f)) +
                          "' holds NaN or Inf");
        break;
      }
    }
  }

  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  uint64_t progress_done_ = 0;  // records of the shards done so far
  uint64_t shard_done_ = 0;     // records of the current shard checksummed so far
  // Checksums run a block of about this many bytes at a time (unless
  // VerifyOptions::block_bytes says otherwise).
  static constexpr uint64_t kBlockBytes = uint64_t{64} << 20;
  std::unique_ptr<tbb::task_arena> arena_;  // opt_.threads > 0
  std::string dir_;
  VerifyOptions opt_;
  VerifyReport* rep_;
  Manifest m_;
  std::mutex mu_;
};

}  // namespace

Status VerifyCache(const std::string& dir, const VerifyOptions& options, VerifyReport* report) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return Status::NotFound(dir + ": no such cache directory");
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + ": not a directory");
  *report = VerifyReport();
  report->level = VerifyLevelName(options.level);
  const auto t0 = std::chrono::steady_clock::now();
  Verifier verifier(dir, options, report);
  verifier.Run();
  verifier.Report(report->records_checked, true);
  std::stable_sort(
      report->problems.begin(), report->problems.end(),
      [](const VerifyProblem& a, const VerifyProblem& b) { return a.index < b.index; });
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

std::string VerifyReportToJson(const std::string& dir, const VerifyReport& r) {
  nlohmann::json j;
  j["cache"] = dir;
  j["level"] = r.level;
  j["clean"] = r.clean();
  j["records_checked"] = r.records_checked;
  j["bytes_checked"] = r.bytes_checked;
  j["shard_bytes"] = r.shard_bytes;
  j["seconds"] = r.seconds;
  nlohmann::json probs = nlohmann::json::array();
  for (const VerifyProblem& p : r.problems) {
    nlohmann::json pj = {{"shard", p.shard}, {"what", p.what}};
    pj["index"] = p.index >= 0 ? nlohmann::json(p.index) : nlohmann::json(nullptr);
    if (!p.source.empty()) pj["source"] = p.source;
    probs.push_back(pj);
  }
  j["problems"] = probs;
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

}  // namespace kiln
