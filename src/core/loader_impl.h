// kiln::Loader's implementation (internal to kiln::core): the worker
// threads that fill the caller's batch slots, the epoch order and partition,
// the read-ahead thread for caches not in memory, and the per-sample
// writers. The methods are defined in loader.cc (order, epochs, workers,
// the fused copy) and loader_readahead.cc (read-ahead and residency).
#ifndef KILN_SRC_CORE_LOADER_IMPL_H_
#define KILN_SRC_CORE_LOADER_IMPL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/encoded_image.h"
#include "core/loader_output.h"
#include "core/page_cache.h"
#include "core/sample_transform.h"
#include "kiln/cache_reader.h"
#include "kiln/loader.h"

namespace kiln {

class Loader::Impl {
 public:
  Impl(const CacheReader* r, const LoaderOptions& o, std::vector<BatchSlot> slots)
      : reader_(r),
        opt_(o),
        slots_(std::move(slots)),
        state_(slots_.size(), SlotState::kFree),
        slot_batch_(slots_.size(), 0),
        slot_status_(slots_.size()) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    ra_cv_.notify_all();
    for (auto& t : threads_) t.join();
    if (ra_thread_.joinable()) ra_thread_.join();
  }

  Status Init();

  // Samples per rank, as torch.utils.data.DistributedSampler computes them,
  // for an epoch of `n` samples.
  uint64_t PerRank(uint64_t n) const;
  uint64_t BatchesFor(uint64_t per_rank) const;

  // This rank's samples of epoch `epoch` after the first `skip` of its
  // permutation (the whole job's): every W-th of the rest, from the rank's
  // own offset, padded by wrapping around as DistributedSampler pads.
  std::vector<uint64_t> Order(uint64_t epoch, uint64_t skip = 0) const;

  Status StartEpoch(uint64_t epoch, uint64_t start, uint64_t skip);

  Status SetResolution(uint32_t crop);

  Status Next(Batch* out);

  void Release(int slot);

  LoaderPosition Position() const;

  // The samples of the epoch's permutation the whole job has consumed when
  // every rank has taken `batch` batches after `skip`.
  uint64_t Consumed(uint64_t skip, uint64_t batch) const;
  uint64_t EpochBatches() const;

  uint64_t BatchSize(uint64_t b) const;

  const Shape& out_shape() const { return out_shape_; }
  uint64_t sample_bytes() const { return sample_bytes_; }
  uint64_t per_rank() const { return per_rank_; }
  uint64_t batches() const { return batches_; }
  uint64_t readahead_budget() const { return ra_budget_; }

 private:
  enum class SlotState { kFree, kFilling, kReady, kInUse };
  // How far (in batches) read-ahead may run past the lowest batch not yet
  // filled: the size of the ring of per-batch byte counts it keeps.
  static constexpr uint64_t kReadAheadBatches = 1024;
  // Records sampled at an epoch's start to judge whether it is in memory.
  static constexpr uint64_t kResidencySamples = 16;

  void Work(int worker);

  // Fills batch b's slot. The reads run under the fault guard: a shard
  // changed under the map fails the batch, naming it, instead of the process.
  //
  // A cold epoch's records are read with pread (ReadTxn::Read) - straight
  // into the slot, or into the worker's scratch buffer for a crop or flip -
  // rather than copied from the map, whose pages would each fault in.
  Status Fill(ReadTxn* txn, uint64_t b, const BatchSlot& slot, bool cold, int worker);

  // A fault while reading record `index`, as a Status naming its shard.
  Status FaultStatus(uint64_t index, const std::string& fault) const;

  // ---- read-ahead ------------------------------------------------------
  //
  // Positions are sample positions in this rank's epoch order; batch b
  // covers [b x batch_size, (b+1) x batch_size). The read-ahead thread asks
  // the kernel for the record at ra_pos_, then the next, as long as the
  // bytes it has asked for beyond the lowest batch not yet filled stay
  // within the budget. ra_cum_[b % kReadAheadBatches] holds ra_total_ (the
  // bytes asked this epoch) when ra_pos_ entered batch b.

  // The lowest batch not yet filled: every batch before it is in a slot or
  // was consumed. REQUIRES: mu_ held.
  uint64_t FilledFrontier() const;

  // Bytes asked for, for positions at or past the frontier. REQUIRES: mu_.
  uint64_t BytesAhead() const;

  // Moves ra_pos_ forward to `pos`, noting ra_total_ at each batch start
  // crossed. REQUIRES: mu_ held.
  void AdvanceReadAhead(uint64_t pos);

  // Whether the read-ahead may look at the record at ra_pos_. REQUIRES: mu_.
  bool ReadAheadCanStep(uint64_t generation) const;

  // Whether the epoch's records are in the page cache, from a sample spread
  // over the positions [from, ep_per_rank_). REQUIRES: mu_ held, the workers
  // and the read-ahead idle (StartEpoch); it may read LMDB's tree pages.
  bool EpochResident(uint64_t from);

  void ReadAhead();

  // The fused copy of one record's image into its place in the slot: the
  // window (or the resampled box) and the flip applied, and the values
  // converted, while moving the bytes; `box` (5 entries) gets what was
  // shown. A window of a fixed record is row copies of the stored dtype.
  Status CopySample(const RecordView& v, uint64_t idx, uint8_t* dst, int worker, int64_t* box,
                    internal::SamplePlan* plan_out);

  const CacheReader* reader_;
  LoaderOptions opt_;
  std::vector<BatchSlot> slots_;
  size_t elem_ = 1;  // of the stored image
  Shape in_shape_, out_shape_;
  DType out_dtype_ = DType::kUint8;
  uint32_t crop_ = 0, max_crop_ = 0;  // the output size now, and the largest the slots take
  // Per worker, when samples are resampled or converted.
  std::vector<std::unique_ptr<internal::SampleWriter>> writers_;
  // Per worker, for a cache of JPEG images: what decodes a sample's box.
  std::vector<std::unique_ptr<internal::EncodedImageReader>> decoders_;
  // The other fields, when the slots take them, and per worker their writer.
  std::vector<LoaderField> fields_;
  std::vector<internal::FieldWriter> field_writers_;
  std::vector<std::vector<uint8_t>> headers_;  // per worker, for ReadTxn::Read
  uint64_t sample_bytes_ = 0, per_rank_ = 0, batches_ = 0;
  // This epoch's (after its skip): samples of this rank, batches, skip.
  uint64_t ep_per_rank_ = 0, ep_batches_ = 0, skip_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SlotState> state_;
  std::vector<uint64_t> slot_batch_;
  std::vector<Status> slot_status_;
  std::vector<uint64_t> order_;
  uint64_t epoch_ = 0, next_claim_ = 0, next_consume_ = 0;
  bool active_ = false, stop_ = false;
  Status failed_;  // the error that ended this epoch's stream, if one did
  std::vector<std::unique_ptr<ReadTxn>> txns_;  // one per worker
  std::vector<std::vector<uint8_t>> scratch_;   // per worker: a record, for cold crops
  std::vector<std::thread> threads_;

  // Read-ahead (see above); the thread exists when ra_budget_ > 0.
  uint64_t ra_budget_ = 0;
  std::unique_ptr<ReadTxn> ra_txn_;
  std::unique_ptr<PageAdvisor> ra_advisor_;
  std::thread ra_thread_;
  std::condition_variable ra_cv_;  // wakes the read-ahead thread
  bool starting_ = false;          // StartEpoch waits for the threads to let go
  uint64_t ra_generation_ = 0;     // bumped by StartEpoch
  bool ra_on_ = false;             // this epoch needs read-ahead
  bool ra_busy_ = false;           // the thread reads order_ without mu_
  uint64_t ra_pos_ = 0, ra_total_ = 0;
  std::vector<uint64_t> ra_cum_;
};

}  // namespace kiln

#endif  // KILN_SRC_CORE_LOADER_IMPL_H_
