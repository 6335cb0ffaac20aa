#include "kiln/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

namespace kiln {

namespace {

// SplitMix64: the seed mixer for per-epoch and per-sample random streams.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform integer in [0, n) from a 64-bit draw (Lemire's multiply-shift).
uint64_t Below(uint64_t draw, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(draw) * n) >> 64);
}

enum class SlotState { kFree, kFilling, kReady, kInUse };

}  // namespace

class Loader::Impl {
 public:
  Impl(const CacheReader* r, const LoaderOptions& o, std::vector<BatchSlot> slots)
      : reader_(r), opt_(o), slots_(std::move(slots)), state_(slots_.size(), SlotState::kFree),
        slot_batch_(slots_.size(), 0), slot_status_(slots_.size()) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  Status Init() {
    const Manifest& m = reader_->manifest();
    if (opt_.batch_size == 0) return Status::InvalidArgument("loader: batch size must be > 0");
    if (opt_.workers < 1) return Status::InvalidArgument("loader: need at least one worker");
    if (opt_.world_size < 1 || opt_.rank < 0 || opt_.rank >= opt_.world_size)
      return Status::InvalidArgument("loader: rank " + std::to_string(opt_.rank) +
                                     " outside world size " + std::to_string(opt_.world_size));
    if (slots_.empty()) return Status::InvalidArgument("loader: no batch slots");
    if (m.count == 0) return Status::InvalidArgument(reader_->dir() + ": the cache is empty");
    elem_ = DTypeSize(m.dtype);
    in_shape_ = m.shape;
    out_shape_ = m.shape;
    if (opt_.crop > 0 || opt_.random_flip) {
      if (m.shape.ndim != 3)
        return Status::InvalidArgument("loader: crop/flip need CHW records, the cache holds " +
                                       m.shape.ToString());
    }
    if (opt_.crop > 0) {
      if (opt_.crop > m.shape.dims[1] || opt_.crop > m.shape.dims[2])
        return Status::InvalidArgument("loader: crop " + std::to_string(opt_.crop) +
                                       " is larger than the records' " + m.shape.ToString());
      out_shape_.dims[1] = out_shape_.dims[2] = opt_.crop;
    }
    sample_bytes_ = out_shape_.NumElements() * elem_;
    // Samples per rank as torch.utils.data.DistributedSampler computes them.
    const uint64_t n = m.count, w = static_cast<uint64_t>(opt_.world_size);
    per_rank_ = (opt_.drop_last && n % w != 0) ? n / w : (n + w - 1) / w;
    batches_ = opt_.drop_last ? per_rank_ / opt_.batch_size
                              : (per_rank_ + opt_.batch_size - 1) / opt_.batch_size;
    // Transactions are made here, not in the workers: a worker that starts
    // late (on a busy machine) must not allocate after warm-up.
    for (int i = 0; i < opt_.workers; ++i) txns_.push_back(reader_->BeginRead());
    for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this, i] { Work(i); });
    return Status::OK();
  }

  std::vector<uint64_t> Order(uint64_t epoch) const {
    const uint64_t n = reader_->size();
    std::vector<uint64_t> all(n);
    for (uint64_t i = 0; i < n; ++i) all[i] = i;
    if (opt_.shuffle) {
      uint64_t state = Mix(opt_.seed ^ Mix(epoch + 0x51ED270B7A3Full));
      for (uint64_t i = n; i > 1; --i) {
        state = Mix(state);
        std::swap(all[i - 1], all[Below(state, i)]);
      }
    }
    const uint64_t w = static_cast<uint64_t>(opt_.world_size);
    const uint64_t total = per_rank_ * w;
    std::vector<uint64_t> mine;
    mine.reserve(per_rank_);
    for (uint64_t k = static_cast<uint64_t>(opt_.rank); k < total; k += w)
      mine.push_back(all[k % n]);  // wrap-around padding
    return mine;
  }

  Status StartEpoch(uint64_t epoch, uint64_t start) {
    std::unique_lock<std::mutex> lock(mu_);
    for (SlotState s : state_)
      if (s == SlotState::kInUse)
        return Status::InvalidArgument("loader: StartEpoch with a slot still in use");
    // Workers claim no more of the old epoch and finish what they are filling.
    active_ = false;
    cv_.wait(lock, [&] {
      return std::none_of(state_.begin(), state_.end(),
                          [](SlotState s) { return s == SlotState::kFilling; });
    });
    if (start > batches_) start = batches_;
    order_ = Order(epoch);
    epoch_ = epoch;
    next_claim_ = next_consume_ = start;
    std::fill(state_.begin(), state_.end(), SlotState::kFree);
    failed_ = Status::OK();
    active_ = true;
    lock.unlock();
    cv_.notify_all();
    return Status::OK();
  }

  Status Next(Batch* out) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    if (!active_ || next_consume_ >= batches_) return Status::NotFound("end of epoch");
    const uint64_t b = next_consume_;
    const size_t s = b % slots_.size();
    if (state_[s] == SlotState::kInUse)  // waiting would never end
      return Status::InvalidArgument(
          "loader: batch " + std::to_string(b) + " goes into slot " + std::to_string(s) +
          ", which the consumer still holds: Release() a batch before asking for more than " +
          std::to_string(slots_.size()) + " at once");
    cv_.wait(lock, [&] { return state_[s] == SlotState::kReady && slot_batch_[s] == b; });
    if (!slot_status_[s].ok()) {
      // The epoch's stream ends here: the slot goes back, workers stop, and
      // the position stays at this batch, so StartEpoch(position) - after a
      // repair, say - loads it again. Until then Next() repeats the error.
      failed_ = slot_status_[s];
      state_[s] = SlotState::kFree;
      active_ = false;
      return failed_;
    }
    state_[s] = SlotState::kInUse;
    ++next_consume_;
    out->slot = static_cast<int>(s);
    out->epoch = epoch_;
    out->index = b;
    out->size = BatchSize(b);
    return Status::OK();
  }

  void Release(int slot) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot >= 0 && static_cast<size_t>(slot) < state_.size() && state_[slot] == SlotState::kInUse)
        state_[slot] = SlotState::kFree;
    }
    cv_.notify_all();
  }

  LoaderPosition Position() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {epoch_, next_consume_};
  }

  uint64_t BatchSize(uint64_t b) const {
    return std::min<uint64_t>(opt_.batch_size, per_rank_ - b * opt_.batch_size);
  }

  const Shape& out_shape() const { return out_shape_; }
  uint64_t sample_bytes() const { return sample_bytes_; }
  uint64_t per_rank() const { return per_rank_; }
  uint64_t batches() const { return batches_; }

 private:
  void Work(int worker) {
    ReadTxn* txn = txns_[worker].get();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] {
        return stop_ || (active_ && next_claim_ < batches_ &&
                         state_[next_claim_ % slots_.size()] == SlotState::kFree);
      });
      if (stop_) return;
      const uint64_t b = next_claim_++;
      const size_t s = b % slots_.size();
      state_[s] = SlotState::kFilling;
      slot_batch_[s] = b;
      lock.unlock();
      // order_ and epoch_ stay put meanwhile: StartEpoch waits for kFilling.
      Status st = Fill(txn, b, slots_[s]);
      txn->Reset();
      lock.lock();
      slot_status_[s] = st;
      state_[s] = SlotState::kReady;
      cv_.notify_all();
    }
  }

  Status Fill(ReadTxn* txn, uint64_t b, const BatchSlot& slot) {
    const uint64_t first = b * opt_.batch_size, count = BatchSize(b);
    uint8_t* dst = static_cast<uint8_t*>(slot.data);
    for (uint64_t j = 0; j < count; ++j) {
      const uint64_t idx = order_[first + j];
      RecordView v;
      KILN_RETURN_IF_ERROR(txn->Get(idx, &v, opt_.verify_checksums));
      slot.labels[j] = v.label;
      CopySample(v.data, idx, dst + j * sample_bytes_);
    }
    return Status::OK();
  }

  // The fused copy: crop window and flip applied while moving the bytes.
  void CopySample(const uint8_t* src, uint64_t idx, uint8_t* dst) const {
    if (opt_.crop == 0 && !opt_.random_flip) {
      std::memcpy(dst, src, sample_bytes_);
      return;
    }
    const uint32_t c = in_shape_.dims[0], h = in_shape_.dims[1], w = in_shape_.dims[2];
    const uint32_t oh = out_shape_.dims[1], ow = out_shape_.dims[2];
    uint64_t draw = Mix(Mix(opt_.seed ^ Mix(epoch_ + 0xA5A5ull)) ^ idx);
    uint32_t y0, x0;
    if (opt_.random_crop) {
      draw = Mix(draw);
      y0 = static_cast<uint32_t>(Below(draw, h - oh + 1));
      draw = Mix(draw);
      x0 = static_cast<uint32_t>(Below(draw, w - ow + 1));
    } else {
      // torchvision CenterCrop: int(round((h - oh) / 2)), round half to even.
      y0 = static_cast<uint32_t>(std::nearbyint((h - oh) / 2.0));
      x0 = static_cast<uint32_t>(std::nearbyint((w - ow) / 2.0));
    }
    draw = Mix(draw);
    const bool flip = opt_.random_flip && (draw >> 63);
    const size_t row = static_cast<size_t>(ow) * elem_;
    for (uint32_t ch = 0; ch < c; ++ch) {
      for (uint32_t y = 0; y < oh; ++y) {
        const uint8_t* s = src + ((static_cast<size_t>(ch) * h + y0 + y) * w + x0) * elem_;
        uint8_t* d = dst + (static_cast<size_t>(ch) * oh + y) * row;
        if (!flip) {
          std::memcpy(d, s, row);
        } else {
          for (uint32_t x = 0; x < ow; ++x) std::memcpy(d + x * elem_, s + (ow - 1 - x) * elem_, elem_);
        }
      }
    }
  }

  const CacheReader* reader_;
  LoaderOptions opt_;
  std::vector<BatchSlot> slots_;
  size_t elem_ = 1;
  Shape in_shape_, out_shape_;
  uint64_t sample_bytes_ = 0, per_rank_ = 0, batches_ = 0;

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
  std::vector<std::thread> threads_;
};

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() = default;

Status Loader::Open(const CacheReader* reader, const LoaderOptions& options,
                    std::vector<BatchSlot> slots, std::unique_ptr<Loader>* out) {
  auto impl = std::make_unique<Impl>(reader, options, std::move(slots));
  KILN_RETURN_IF_ERROR(impl->Init());
  out->reset(new Loader(std::move(impl)));
  return Status::OK();
}

const Shape& Loader::sample_shape() const { return impl_->out_shape(); }
uint64_t Loader::sample_bytes() const { return impl_->sample_bytes(); }
uint64_t Loader::samples_per_epoch() const { return impl_->per_rank(); }
uint64_t Loader::batches_per_epoch() const { return impl_->batches(); }
Status Loader::StartEpoch(uint64_t epoch, uint64_t start_batch) {
  return impl_->StartEpoch(epoch, start_batch);
}
Status Loader::Next(Batch* out) { return impl_->Next(out); }
void Loader::Release(int slot) { impl_->Release(slot); }
LoaderPosition Loader::position() const { return impl_->Position(); }
std::vector<uint64_t> Loader::EpochOrder(uint64_t epoch) const { return impl_->Order(epoch); }

}  // namespace kiln
