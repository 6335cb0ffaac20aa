#include "kiln/duplicates.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "core/page_cache.h"

namespace kiln {

Fingerprint FingerprintBytes(const void* data, size_t bytes) {
  const XXH128_hash_t h = XXH3_128bits(data, bytes);
  Fingerprint f;
  f.high = h.high64;
  f.low = h.low64;
  return f;
}

Fingerprint FingerprintRecord(const Manifest& m, const RecordView& v) {
  if (m.format_version != kFormatVersion2) return FingerprintBytes(v.data, v.bytes);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  for (int f = 0; f < v.num_fields; ++f) {
    if (f == m.label_field) continue;
    const FieldView& fv = v.fields[f];
    uint8_t shape[4 * (kMaxDims + 1)];
    const uint32_t dims[kMaxDims + 1] = {static_cast<uint32_t>(fv.shape.ndim), fv.shape.dims[0],
                                         fv.shape.dims[1], fv.shape.dims[2], fv.shape.dims[3]};
    for (int i = 0; i <= kMaxDims; ++i)
      for (int b = 0; b < 4; ++b) shape[4 * i + b] = static_cast<uint8_t>(dims[i] >> (8 * b));
    XXH3_128bits_update(&state, shape, 4 * (fv.shape.ndim + 1));
    XXH3_128bits_update(&state, fv.data, fv.bytes);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  Fingerprint out;
  out.high = h.high64;
  out.low = h.low64;
  return out;
}

Status FingerprintCache(const CacheReader& reader, int threads, std::vector<RecordPrint>* out,
                        uint64_t from) {
  const uint64_t n = reader.size();
  from = std::min<uint64_t>(from, std::min<uint64_t>(n, out->size()));
  out->resize(n);
  std::fill(out->begin() + static_cast<std::ptrdiff_t>(from), out->end(), RecordPrint());
  std::mutex mu;
  Status failure;
  std::atomic<bool> failed{false};
  // Hashes records [lo, hi) in parallel.
  auto hash = [&](uint64_t lo, uint64_t hi) {
    tbb::parallel_for(tbb::blocked_range<uint64_t>(lo, hi, 16),
                      [&](const tbb::blocked_range<uint64_t>& r) {
                        if (failed) return;
                        std::unique_ptr<ReadTxn> txn = reader.BeginRead();
                        RecordView v;
                        for (uint64_t i = r.begin(); i < r.end(); ++i) {
                          const Status s = txn->Get(i, &v);
                          if (!s.ok()) {
                            std::lock_guard<std::mutex> lock(mu);
                            if (failure.ok()) failure = s;
                            failed = true;
                            return;
                          }
                          (*out)[i].print = FingerprintRecord(reader.manifest(), v);
                          (*out)[i].label = v.label;
                        }
                      });
  };
  // In index order, which is file order, a block of about kBlockBytes at a
  // time: this thread locates each record of the next block (touching only
  // LMDB's tree pages) and asks the disk for the bytes ahead of it
  // (SequentialReadAhead), so that a cold cache is read at the disk's
  // sequential speed, not a page per fault; then the block is hashed in
  // parallel.
  constexpr uint64_t kBlockBytes = uint64_t{32} << 20;
  auto work = [&] {
    SequentialReadAhead ahead;
    MappedFileEnds ends(reader);
    std::unique_ptr<ReadTxn> locate = reader.BeginRead();
    uint64_t lo = from, bytes = 0;
    for (uint64_t i = from; i < n && !failed; ++i) {
      const uint8_t* value = nullptr;
      uint64_t size = 0;
      if (locate->Locate(i, &value, &size).ok()) {
        ahead.Reached(value, ends.Of(value));
        bytes += size;
      }
      if (bytes >= kBlockBytes || i + 1 == n) {
        locate->Reset();
        hash(lo, i + 1);
        lo = i + 1;
        bytes = 0;
      }
    }
  };
  if (threads > 0) {
    tbb::task_arena arena(threads);
    arena.execute(work);
  } else {
    work();
  }
  if (!failure.ok()) {
    out->clear();
    return Status::Corruption(reader.dir() + ": cannot fingerprint the records: " +
                              failure.message() + " (run kiln verify on it)");
  }
  return Status::OK();
}

bool DuplicateGroup::labels_differ() const {
  for (const DuplicateMember& m : members)
    if (m.label != members.front().label) return true;
  return false;
}

bool DuplicateGroup::spans(size_t a, size_t b) const {
  bool in_a = false, in_b = false;
  for (const DuplicateMember& m : members) {
    in_a = in_a || m.cache == a;
    in_b = in_b || m.cache == b;
  }
  return in_a && in_b;
}

std::vector<DuplicateGroup> FindDuplicates(const std::vector<std::vector<RecordPrint>>& caches) {
  // (print, cache, record), sorted: equal prints become neighbours, each
  // run in (cache, record) order.
  struct Entry {
    Fingerprint print;
    size_t cache;
    uint64_t record;
  };
  std::vector<Entry> all;
  size_t total = 0;
  for (const auto& c : caches) total += c.size();
  all.reserve(total);
  for (size_t c = 0; c < caches.size(); ++c)
    for (uint64_t i = 0; i < caches[c].size(); ++i) all.push_back({caches[c][i].print, c, i});
  std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
    if (a.print != b.print) return a.print < b.print;
    return std::make_pair(a.cache, a.record) < std::make_pair(b.cache, b.record);
  });
  std::vector<DuplicateGroup> groups;
  for (size_t i = 0; i < all.size();) {
    size_t j = i + 1;
    while (j < all.size() && all[j].print == all[i].print) ++j;
    if (j - i > 1) {
      DuplicateGroup g;
      g.print = all[i].print;
      for (size_t k = i; k < j; ++k)
        g.members.push_back(
            {all[k].cache, all[k].record, caches[all[k].cache][all[k].record].label});
      groups.push_back(std::move(g));
    }
    i = j;
  }
  std::sort(groups.begin(), groups.end(), [](const DuplicateGroup& a, const DuplicateGroup& b) {
    const DuplicateMember &x = a.members.front(), &y = b.members.front();
    return std::make_pair(x.cache, x.record) < std::make_pair(y.cache, y.record);
  });
  return groups;
}

DuplicateCounts CountDuplicates(const std::vector<DuplicateGroup>& groups, size_t in, size_t of) {
  DuplicateCounts c;
  for (const DuplicateGroup& g : groups) {
    ++c.groups;
    c.repeats += g.members.size() - 1;
    if (g.labels_differ()) ++c.label_conflicts;
    if (in != of && g.spans(in, of))
      for (const DuplicateMember& m : g.members) c.overlap += m.cache == in;
  }
  return c;
}

std::string DuplicateSummary(const std::string& file, const DuplicateCounts& c) {
  if (c.groups == 0) return "duplicates: none";
  std::string s = "duplicates: " + std::to_string(c.repeats) +
                  (c.repeats == 1 ? " record repeats" : " records repeat") + " another (" +
                  std::to_string(c.groups) + (c.groups == 1 ? " group" : " groups");
  if (c.label_conflicts > 0)
    s += ", " + std::to_string(c.label_conflicts) + " with different labels";
  s += ")";
  if (c.overlap > 0)
    s += ", " + std::to_string(c.overlap) + " val " + (c.overlap == 1 ? "record" : "records") +
         " also in train (leakage: validation accuracy is inflated)";
  return s + "; see " + file;
}

}  // namespace kiln
